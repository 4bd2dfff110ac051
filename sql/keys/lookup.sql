-- The user whose live key hashes to $1, if any.
SELECT user_id FROM api_keys WHERE key_sha256 = $1 AND revoked_at IS NULL
