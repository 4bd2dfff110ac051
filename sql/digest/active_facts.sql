-- Seed 000's digest query: the session's active, unexpired facts. $1 session.
SELECT type, key, value, expires_at
  FROM facts
 WHERE session_id = $1
   AND status = 'active'
   AND (expires_at IS NULL OR expires_at > now())
