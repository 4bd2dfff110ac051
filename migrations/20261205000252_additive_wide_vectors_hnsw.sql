-- no-transaction
-- The nearest-neighbour index over 768-wide message vectors (HNSW, cosine), built without
-- blocking writes; rows without one (every row of a 384-wide deployment) are not in it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS memory_messages_embedding_768_hnsw
    ON memory_messages USING hnsw (embedding_768 vector_cosine_ops);
