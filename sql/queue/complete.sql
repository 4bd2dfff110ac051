-- Mark a running turn done with its reply. Runs only after fence.sql succeeded.
-- $1 turn id, $2 reply.
UPDATE turns
   SET state = 'done', reply = $2, error = NULL, finished_at = now()
 WHERE id = $1 AND state = 'running'
RETURNING session_id
