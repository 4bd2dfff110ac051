-- Stores a new key's hash for a user. $1 user, $2 label, $3 prefix, $4 SHA-256 of the key.
INSERT INTO api_keys (user_id, label, prefix, key_sha256)
VALUES ($1, $2, $3, $4)
RETURNING id
