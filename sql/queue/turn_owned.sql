-- A turn with its latest log row, only when it belongs to the asking user.
SELECT t.session_id, t.state::text AS state, t.reply, t.error, t.attempts,
      extract(epoch FROM t.created_at)::bigint AS created,
      l.u_tokens, l.r_tokens, l.cold, l.digest_injected, l.tokens_in_kv, l.digest_version,
      l.prompt_tokens, l.prefill_tokens, l.finish_reason
 FROM turns t
 LEFT JOIN LATERAL (SELECT * FROM turn_log WHERE turn_id = t.id ORDER BY id DESC LIMIT 1) l ON true
WHERE t.id = $1 AND t.user_id = $2
