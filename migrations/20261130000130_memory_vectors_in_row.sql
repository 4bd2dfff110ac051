-- A row with both vectors (2 × 1,544 bytes) passes the default 2 KB toast target, so one
-- of them went to the TOAST table, and an exact scan fetched it from there for every row:
-- 40 ms for a user's 10,000 message vectors against 12-15 ms for the same rows kept in
-- the row (psql, the latency fill). A target of a whole page keeps both vectors in the
-- row; a long text is still compressed or moved out first. Rows written before this keep
-- their out-of-line vector until rewritten (VACUUM FULL, or `kvmem memory reindex`).
ALTER TABLE memory_messages SET (toast_tuple_target = 8160);
