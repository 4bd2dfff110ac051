-- A new character. $1 owner (who set it up), $2 name, $3 persona, $4 public.
INSERT INTO user_characters (user_id, name, persona, public)
VALUES ($1, $2, $3, $4)
RETURNING id, user_id, name, persona, public, extract(epoch FROM created_at)::bigint AS created
