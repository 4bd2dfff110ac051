-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- Messages without a vector of model $4 (none, or another model's), oldest first (reindex
-- and search backfill); $1 NULL = every user. Autocommit read.
SELECT id, speaker, text, context
  FROM memory_messages
 WHERE (embedding IS NULL OR embed_model IS DISTINCT FROM $4) AND ($1::text IS NULL OR user_id = $1) AND id > $2
 ORDER BY id
 LIMIT $3
