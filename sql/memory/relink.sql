-- Re-chains one key's validity intervals (inside the upsert's transaction): each version
-- is valid until the next one starts. First every version is closed, then the newest is
-- reopened, so the one-current-version index holds at every step.
WITH chain AS (
    SELECT id, valid_from,
           lead(valid_from) OVER (ORDER BY valid_from, text, id) AS next_from,
           row_number() OVER (ORDER BY valid_from DESC, text DESC, id DESC) AS from_end
      FROM memories
     WHERE user_id = $1 AND coalesce(guild_id, '') = coalesce($2, '')
       AND coalesce(character_id, 0) = coalesce($3, 0) AND memory_key = $4
)
UPDATE memories m
   SET valid_to = coalesce(c.next_from, c.valid_from)
  FROM chain c
 WHERE m.id = c.id AND m.valid_to IS DISTINCT FROM coalesce(c.next_from, c.valid_from)
