-- One row per attempt, inside the completion (or failure) transaction. $1 is a JSON array
-- of rows keyed by column name, so a batch of completions inserts its log rows at once.
INSERT INTO turn_log (
    turn_id, attempt, worker_id, path, sid, loaded, cold, cold_reason, rebuild,
    tokens_loaded, tokens_in_kv, kv_bytes, n_ctx, digest_injected, digest_version,
    s_tokens, u_tokens, r_tokens, bpt, status, error, latency_ms,
    load_ms, prefill_ms, ttft_ms, generate_ms, redecode_ms, save_ms, started_at,
    m_tokens, memories_injected, memory_keys, recall_in_kv, recall_ms,
    context_injected, c_tokens, context_version, prefill_tokens, hud_kept, kv_source,
    prompt_tokens, finish_reason)
SELECT turn_id, attempt, worker_id, path, sid, loaded, cold, cold_reason, rebuild,
       tokens_loaded, tokens_in_kv, kv_bytes, n_ctx, digest_injected, digest_version,
       s_tokens, u_tokens, r_tokens, bpt, status, error, latency_ms,
       load_ms, prefill_ms, ttft_ms, generate_ms, redecode_ms, save_ms, started_at,
       m_tokens, memories_injected, memory_keys, recall_in_kv, recall_ms,
       context_injected, c_tokens, context_version, prefill_tokens, hud_kept, kv_source,
       prompt_tokens, finish_reason
  FROM jsonb_populate_recordset(NULL::turn_log, $1)
