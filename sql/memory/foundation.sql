-- Foundation memories (seed 001): the pinned facts, up to 20 (autocommit read).
SELECT id, text, entity_refs, created_at
  FROM memories
 WHERE user_id = $1
   AND ($2::bigint IS NULL OR character_id = $2 OR character_id IS NULL)
   AND guild_id IS NOT DISTINCT FROM $3
   AND status = 'ACTIVE' AND valid_to IS NULL AND pinned
 ORDER BY created_at DESC, id DESC
 LIMIT 20
