-- Message vectors 768 wide (EmbeddingGemma-300M, docs/memory.md#embedders) beside the
-- 384-wide ones (e5-small, MiniLM): pgvector's HNSW index needs one width per column, so
-- each width has its own pair of columns, each with its own model id. A message keeps
-- the vectors of both, so switching the embedder back and forth re-embeds nothing twice,
-- and a worker of the previous release (384 wide only) never reads these. Additive:
-- nullable columns, no rewrite of the table. Their indexes follow, one per migration,
-- built without blocking writes.
ALTER TABLE memory_messages ADD COLUMN embedding_768 vector(768);
ALTER TABLE memory_messages ADD COLUMN embed_model_768 text;
ALTER TABLE memory_messages ADD COLUMN span_embedding_768 vector(768);
ALTER TABLE memory_messages ADD COLUMN span_embed_model_768 text;
