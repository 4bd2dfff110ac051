-- no-transaction
-- The approximate nearest-neighbour index over message vectors (HNSW, cosine), built
-- without blocking writes: the chat queue's completions insert into this table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS memory_messages_embedding_hnsw
    ON memory_messages USING hnsw (embedding vector_cosine_ops);
