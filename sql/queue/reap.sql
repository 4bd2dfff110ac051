-- Return turns whose lease expired (their worker died or stalled) to the queue.
-- The attempt was counted at claim; out of attempts the turn is 'dead'.
-- Bumping the fencing token makes the old owner's completion fail.
WITH expired AS (
    UPDATE session_locks l
       SET fencing_token = l.fencing_token + 1,
           turn_id = NULL, owner = NULL, expires_at = now()
     WHERE l.turn_id IS NOT NULL AND l.expires_at <= now()
    RETURNING l.session_id
)
UPDATE turns t
   SET state = CASE WHEN t.attempts >= t.max_attempts THEN 'dead'::turn_state
                    ELSE 'queued'::turn_state END,
       error = 'lease expired: worker ' || coalesce(t.worker_id, '?') || ' stopped heartbeating',
       finished_at = CASE WHEN t.attempts >= t.max_attempts THEN now() END
  FROM expired
 WHERE t.session_id = expired.session_id AND t.state = 'running'
RETURNING t.id, t.session_id, t.state
