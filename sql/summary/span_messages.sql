-- The dialogue of one user and character with message ids in ($3, $4], oldest first,
-- the newest $5 of them.
SELECT * FROM (
    SELECT m.id, m.role, m.content, m.created_at
      FROM messages m
      JOIN turns t ON t.id = m.turn_id
     WHERE t.user_id = $1 AND t.character_id = $2 AND m.id > $3 AND m.id <= $4
     ORDER BY m.id DESC
     LIMIT $5
) recent ORDER BY id
