-- Inside the completion transaction: lock the lease row and prove we still hold it.
-- $1 session, $2 fencing token, $3 owner, $4 turn id.
SELECT 1 AS held
  FROM session_locks
 WHERE session_id = $1 AND fencing_token = $2 AND owner = $3 AND turn_id = $4
   FOR UPDATE
