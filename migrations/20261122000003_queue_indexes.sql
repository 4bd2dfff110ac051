-- Queue indexes after the first benchmarks.
--
-- turns_pending_idx served the first claim design (a scan of queued turns in id order).
-- Claims now walk the head pointers in session_locks, and the index only misled the
-- planner: after ANALYZE on a table of finished turns it estimates no pending rows, so it
-- joined the claimed turns through a full scan of this index (about 1 s per claim with
-- 10k turns queued and 1M finished), and picked it for the next-head lookup on release.
-- Pending lookups go through turns_session_pending_idx, and every turns update now
-- writes one index entry less.
DROP INDEX IF EXISTS turns_pending_idx;

-- session_locks is small and every turn updates it twice (claim, release). Those updates
-- cannot be HOT (they change indexed columns), so the ready index collects dead entries
-- fast. Vacuum and analyze it by row count instead of by a fraction of the table.
ALTER TABLE session_locks SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 2000
);
