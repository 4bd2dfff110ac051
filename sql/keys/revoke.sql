-- Revokes one key by id (a second revoke keeps the first time). $1 id; the row's user, if any.
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
 WHERE id = $1
RETURNING user_id
