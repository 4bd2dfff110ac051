-- The session's digest version and when it changed.
SELECT digest_version, updated_at FROM state_digest WHERE session_id = $1
