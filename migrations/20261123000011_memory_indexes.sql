-- Per-user full-text search, after the first latency benchmark (ops/bench-memory latency):
-- the plain GIN index on tsv matched a common word across every user (125k rows of 1M for
-- "kayak") before the user filter. A GIN index over (user_id, tsv) with btree_gin (contrib,
-- shipped with PostgreSQL) intersects both inside the index.
CREATE EXTENSION IF NOT EXISTS btree_gin;
CREATE INDEX memory_messages_user_tsv_idx ON memory_messages USING gin (user_id, tsv);
DROP INDEX IF EXISTS memory_messages_tsv_idx;
CREATE INDEX memories_user_tsv_idx ON memories USING gin (user_id, tsv);
DROP INDEX IF EXISTS memories_tsv_idx;
