-- no-transaction
-- The nearest-neighbour index over 768-wide span vectors (HNSW, cosine), built without
-- blocking writes.
CREATE INDEX CONCURRENTLY IF NOT EXISTS memory_messages_span_768_hnsw
    ON memory_messages USING hnsw (span_embedding_768 vector_cosine_ops);
