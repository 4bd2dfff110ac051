-- The storage upkeep's running totals (evictions, quarantine removals, rows per table).
SELECT name, value FROM kvmem_storage_counts ORDER BY name
