-- Marks the kept fact of a folded group and merges the group's provenance into it
-- (inside the curator's transaction with archive_ids).
UPDATE memories
   SET source = 'curated_fold',
       source_message_ids = ARRAY(SELECT DISTINCT x FROM unnest(source_message_ids || $2::text[]) AS x ORDER BY x),
       importance = greatest(importance, $3),
       updated_at = now()
 WHERE id = $1
