-- Adds what one storage sweep removed to the running totals: $1 counter names, $2 amounts.
INSERT INTO kvmem_storage_counts (name, value)
SELECT name, value FROM unnest($1::text[], $2::bigint[]) AS c(name, value)
ON CONFLICT (name) DO UPDATE
   SET value = kvmem_storage_counts.value + EXCLUDED.value, updated_at = now()
