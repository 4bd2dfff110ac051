-- Edits a character: $2 name, $3 persona, $4 public (each null: unchanged), only when it is
-- $5's own ($5 null: an operator, any character). A changed persona stamps updated_at, so
-- a warm session's snapshot made under the old one is refused and rebuilt at its next turn.
UPDATE user_characters
   SET name = coalesce($2, name),
       persona = coalesce($3, persona),
       public = coalesce($4, public),
       updated_at = CASE WHEN $3::text IS NOT NULL AND $3 IS DISTINCT FROM persona
                         THEN now() ELSE updated_at END
 WHERE id = $1 AND ($5::text IS NULL OR user_id = $5)
RETURNING id, user_id, name, persona, public, extract(epoch FROM created_at)::bigint AS created
