-- Return a reaped turn to the queue; the attempt was counted at claim, and out of
-- attempts the turn is 'dead'. $1 turn id.
UPDATE turns t
   SET state = CASE WHEN t.attempts >= t.max_attempts THEN 'dead'::turn_state
                    ELSE 'queued'::turn_state END,
       error = 'lease expired: worker ' || coalesce(t.worker_id, '?') || ' stopped heartbeating',
       finished_at = CASE WHEN t.attempts >= t.max_attempts THEN now() END
 WHERE t.id = $1 AND t.state = 'running'
RETURNING t.state
