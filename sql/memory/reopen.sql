-- Opens the newest version of a key (second half of relink, same transaction).
UPDATE memories SET valid_to = NULL
 WHERE id = (SELECT id FROM memories
              WHERE user_id = $1 AND coalesce(guild_id, '') = coalesce($2, '')
                AND coalesce(character_id, 0) = coalesce($3, 0) AND memory_key = $4
              ORDER BY valid_from DESC, text DESC, id DESC LIMIT 1)
RETURNING id
