-- Return a reaped turn to the queue; the attempt was counted at claim, and out of
-- attempts the turn is 'dead'. $1 turn id.
WITH reaped AS (
    UPDATE turns t
       SET state = CASE WHEN t.attempts >= t.max_attempts THEN 'dead'::turn_state
                        ELSE 'queued'::turn_state END,
           error = 'lease expired: worker ' || coalesce(t.worker_id, '?') || ' stopped heartbeating',
           finished_at = CASE WHEN t.attempts >= t.max_attempts THEN now() END
     WHERE t.id = $1 AND t.state = 'running'
    RETURNING t.id, t.session_id, t.state, t.worker_id
), audit AS (
    INSERT INTO events (session_id, turn_id, kind, detail)
    SELECT session_id, id, 'reaped', jsonb_build_object('worker', worker_id, 'state', state)
      FROM reaped
)
SELECT state FROM reaped
