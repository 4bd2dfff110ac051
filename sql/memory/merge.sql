-- Folds a repeated write into the version that already says the same thing (inside the
-- upsert's transaction): provenance and confidence accumulate, nothing is duplicated.
UPDATE memories
   SET confidence = greatest(confidence, $2),
       importance = greatest(importance, $3),
       pinned = pinned OR $4,
       source_message_ids = ARRAY(SELECT DISTINCT x FROM unnest(source_message_ids || $5::text[]) AS x ORDER BY x),
       evidence_text = coalesce(evidence_text, $6),
       valid_from = least(valid_from, $7),
       status = 'ACTIVE',
       embedding = coalesce($8, embedding),
       embed_model = coalesce($9, embed_model),
       updated_at = now()
 WHERE id = $1
RETURNING id
