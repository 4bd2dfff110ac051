-- Status: turns by state.
SELECT state::text AS state, sum(turns)::bigint AS turns FROM kvmem_queue_stats GROUP BY state ORDER BY state
