-- no-transaction
-- A user's vectors per model, counted by an index-only scan: a search says how many of the
-- user's messages its vector legs left out (no vector, or another model's), and reindex
-- finds them. Built without blocking writes.
CREATE INDEX CONCURRENTLY IF NOT EXISTS memory_messages_user_model_idx
    ON memory_messages (user_id, embed_model);
