-- Mark a running turn done with its reply, and record the event. Runs only after
-- fence.sql succeeded. $1 turn id, $2 reply.
WITH done AS (
    UPDATE turns
       SET state = 'done', reply = $2, error = NULL, finished_at = now()
     WHERE id = $1 AND state = 'running'
    RETURNING id, session_id
), audit AS (
    INSERT INTO events (session_id, turn_id, kind)
    SELECT session_id, id, 'completed' FROM done
)
SELECT session_id FROM done
