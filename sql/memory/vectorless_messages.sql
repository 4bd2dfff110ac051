-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- A few of one user's messages ($1) with no vector at all, oldest first, at most $2: the
-- memory lane embeds them beside its job (a search only reads, and scores them lexically
-- meanwhile). Another model's vector waits for `kvmem memory reindex`. Autocommit read.
SELECT id, speaker, text, context
  FROM memory_messages
 WHERE user_id = $1 AND embedding IS NULL
 ORDER BY id
 LIMIT $2
