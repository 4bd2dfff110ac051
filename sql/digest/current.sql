-- The session's stored digest, if clean and unexpired.
SELECT digest_version, digest_content FROM state_digest
WHERE session_id = $1 AND NOT EXISTS (SELECT 1 FROM digest_dirty WHERE session_id = $1)
  AND (next_expiry_at IS NULL OR next_expiry_at > now())
