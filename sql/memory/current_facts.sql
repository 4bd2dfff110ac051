-- The facts visible to one user/character/guild as of $4 (NULL = current), newest first
-- (autocommit read). Character filter per seed 001; guild is a hard scope.
SELECT id, user_id, character_id, guild_id, channel_id, subject, kind, fact_type, text,
       entity_refs, entity_label, importance, pinned, memory_key, source, status, confidence,
       evidence_text, source_message_ids, valid_from, valid_to, created_at, embedding,
       embed_model
  FROM memories
 WHERE user_id = $1
   AND ($2::bigint IS NULL OR character_id = $2 OR character_id IS NULL)
   AND guild_id IS NOT DISTINCT FROM $3
   AND status = 'ACTIVE'
   AND (CASE WHEN $4::timestamptz IS NULL THEN valid_to IS NULL
             ELSE valid_from <= $4 AND (valid_to IS NULL OR valid_to > $4) END)
 ORDER BY pinned DESC, importance DESC, valid_from DESC, id DESC
 LIMIT $5
