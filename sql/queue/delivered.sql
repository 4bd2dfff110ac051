-- The turn's answer (its reply or the error it ended with) is being handed to a client:
-- from now on an identical request without a retry header is a new turn. Only turns
-- queued by a hashed request are looked up that way, so only they are written.
UPDATE turns SET delivered_at = now()
 WHERE id = $1 AND request_hash IS NOT NULL AND delivered_at IS NULL
