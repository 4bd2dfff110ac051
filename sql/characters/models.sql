-- The characters a user may chat with, as /v1/models lists them: the public ones and the
-- user's own ($1; null: the public ones only), oldest first. No other user's own character
-- ever appears here.
SELECT id, name, extract(epoch FROM created_at)::bigint AS created, public
  FROM user_characters
 WHERE public OR user_id = $1
 ORDER BY id
