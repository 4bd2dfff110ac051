-- Extend a held lease. Touches only the small session_locks row.
-- $1 session, $2 fencing token, $3 owner, $4 lease length in ms.
-- No row back means the lease was lost (reaped or taken over).
UPDATE session_locks
   SET heartbeat_at = now(),
       expires_at   = now() + make_interval(secs => $4 / 1000.0)
 WHERE session_id = $1 AND fencing_token = $2 AND owner = $3
RETURNING expires_at
