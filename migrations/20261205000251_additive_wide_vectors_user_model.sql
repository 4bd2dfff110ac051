-- no-transaction
-- A user's 768-wide vectors per model, counted by an index-only scan, as
-- memory_messages_user_model_idx counts the 384-wide ones. Built without blocking writes.
CREATE INDEX CONCURRENTLY IF NOT EXISTS memory_messages_user_model_768_idx
    ON memory_messages (user_id, embed_model_768);
