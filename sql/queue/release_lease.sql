-- Free the session for its next turn; the token stays, so it keeps growing.
-- $1 session, $2 fencing token.
UPDATE session_locks
   SET turn_id = NULL, owner = NULL, expires_at = now()
 WHERE session_id = $1 AND fencing_token = $2
