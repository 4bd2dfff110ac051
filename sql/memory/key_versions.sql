-- Every version of one key in one scope, in validity order (inside the upsert's transaction).
SELECT id, text, valid_from
  FROM memories
 WHERE user_id = $1 AND coalesce(guild_id, '') = coalesce($2, '')
   AND coalesce(character_id, 0) = coalesce($3, 0) AND memory_key = $4
 ORDER BY valid_from, text, id
