-- Seed 000's digest query for several sessions at once: their active, unexpired facts.
-- $1 session ids.
SELECT session_id, type, key, value, expires_at
  FROM facts
 WHERE session_id = ANY($1)
   AND status = 'active'
   AND (expires_at IS NULL OR expires_at > now())
