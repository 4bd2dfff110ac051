-- Status: turn latency percentiles.
SELECT turns, p50_ms, p95_ms FROM kvmem_latency
