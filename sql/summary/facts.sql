-- Seed 004's factual memory for the merge ($1 user, $2 scope): the user's memory blob,
-- else the current active facts, pinned and important first (autocommit read).
SELECT coalesce(
    (SELECT nullif(btrim(blob), '') FROM memory_blobs WHERE user_id = $1 AND guild_id = $2),
    (SELECT string_agg(text, ' ' ORDER BY pinned DESC, importance DESC, id)
       FROM (SELECT text, pinned, importance, id FROM memories
              WHERE user_id = $1 AND coalesce(guild_id, '') = $2
                AND status = 'ACTIVE' AND valid_to IS NULL
              ORDER BY pinned DESC, importance DESC, id LIMIT 20) f),
    '') AS facts
