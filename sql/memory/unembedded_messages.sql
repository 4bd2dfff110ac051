-- Messages still without a vector, oldest first (reindex and search backfill); $1 NULL =
-- every user. Autocommit read.
SELECT id, speaker, text, context
  FROM memory_messages
 WHERE embedding IS NULL AND ($1::text IS NULL OR user_id = $1) AND id > $2
 ORDER BY id
 LIMIT $3
