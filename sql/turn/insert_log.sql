-- One row per attempt, inside the completion (or failure) transaction.
INSERT INTO turn_log (
    turn_id, attempt, worker_id, path, sid, loaded, cold, cold_reason,
    tokens_loaded, tokens_in_kv, kv_bytes, n_ctx, digest_injected, digest_version,
    s_tokens, u_tokens, r_tokens, bpt, status, error, latency_ms,
    load_ms, prefill_ms, ttft_ms, generate_ms, save_ms, started_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
        $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27)
