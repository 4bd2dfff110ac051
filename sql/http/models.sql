-- The characters a user may chat with, as /v1/models lists them: the user's own, oldest
-- first. Characters belong to one user (user_characters.user_id); no other user's ever
-- appears here.
SELECT id, name, extract(epoch FROM created_at)::bigint AS created
  FROM user_characters
 WHERE user_id = $1
 ORDER BY id
