-- Bytes per KV token of the latest saved snapshot (sizes the rotate hint).
SELECT bpt FROM turn_log WHERE bpt > 0 ORDER BY id DESC LIMIT 1
