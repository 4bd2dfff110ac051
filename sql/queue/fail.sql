-- Record a failed attempt. Runs only after fence.sql succeeded.
-- $1 turn id, $2 error text, $3 retryable, $4 backoff base ms, $5 backoff max ms.
--
-- Retryable errors go back to 'queued' with exponential backoff, and stay the
-- head of their session. Out of attempts they are 'dead'; fatal errors (bad
-- input) are 'failed' at once. Both end states unblock the session's next turn.
WITH failed AS (
    UPDATE turns
       SET state = CASE
                     WHEN NOT $3 THEN 'failed'::turn_state
                     WHEN attempts >= max_attempts THEN 'dead'::turn_state
                     ELSE 'queued'::turn_state
                   END,
           error = $2,
           run_at = now() + make_interval(secs =>
                      LEAST($5::float8, $4::float8 * power(2, GREATEST(attempts - 1, 0))) / 1000.0),
           finished_at = CASE WHEN NOT $3 OR attempts >= max_attempts THEN now() END
     WHERE id = $1 AND state = 'running'
    RETURNING id, session_id, state, attempts, error
), audit AS (
    INSERT INTO events (session_id, turn_id, kind, detail)
    SELECT session_id, id,
           CASE state WHEN 'queued' THEN 'retry_scheduled' ELSE state::text END,
           jsonb_build_object('attempt', attempts, 'error', error)
      FROM failed
)
SELECT session_id, state FROM failed
