-- One character, if $2 may see it: their own or a public one ($2 null: an operator, any).
SELECT id, user_id, name, persona, public, extract(epoch FROM created_at)::bigint AS created
  FROM user_characters
 WHERE id = $1 AND ($2::text IS NULL OR user_id = $2 OR public)
