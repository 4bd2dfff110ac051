-- Characters: with $1 a user, the public ones and that user's own; with $1 null and $2
-- true, every character (an operator's list); with $1 null and $2 false, the public ones.
SELECT id, user_id, name, persona, public, extract(epoch FROM created_at)::bigint AS created
  FROM user_characters
 WHERE public OR user_id = $1 OR ($1::text IS NULL AND $2)
 ORDER BY id
