-- Give a claimed turn back untouched (graceful shutdown): the attempt is not counted.
-- $1 turn id, $2 session, $3 fencing token, $4 owner.
WITH lease AS (
    UPDATE session_locks
       SET turn_id = NULL, owner = NULL, expires_at = now()
     WHERE session_id = $2 AND fencing_token = $3 AND owner = $4 AND turn_id = $1
    RETURNING session_id
)
UPDATE turns t
   SET state = 'queued', attempts = GREATEST(t.attempts - 1, 0), worker_id = NULL
  FROM lease
 WHERE t.id = $1 AND t.state = 'running'
RETURNING t.id
