-- Demo: the session's successful turn logs, in turn order.
SELECT l.cold, l.digest_injected, l.tokens_in_kv, l.kv_bytes, l.latency_ms, l.ttft_ms, l.digest_version
FROM turn_log l WHERE l.sid = $1 AND l.status = 'OK' ORDER BY l.turn_id
