-- Queue depth by state and lane, for /metrics.
SELECT state::text, lane, turns FROM kvmem_queue_stats
