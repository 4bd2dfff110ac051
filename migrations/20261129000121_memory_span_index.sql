-- no-transaction
-- The nearest-neighbour index over span vectors (HNSW, cosine), built without blocking
-- writes, as the message vectors' index is.
CREATE INDEX CONCURRENTLY IF NOT EXISTS memory_messages_span_hnsw
    ON memory_messages USING hnsw (span_embedding vector_cosine_ops);
