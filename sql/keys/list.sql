-- The keys, a user's or everyone's ($1 null), newest first; never the key itself.
SELECT id, user_id, label, prefix, created_at, revoked_at
  FROM api_keys
 WHERE $1::text IS NULL OR user_id = $1
 ORDER BY id DESC
