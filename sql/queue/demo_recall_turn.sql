-- Demo (recall scene): what one turn injected, from its last log row, and its reply.
SELECT l.memory_keys, l.m_tokens, l.context_injected, l.c_tokens, l.tokens_in_kv,
       coalesce(t.reply, '') AS reply
  FROM turns t
  JOIN LATERAL (SELECT * FROM turn_log WHERE turn_id = t.id ORDER BY id DESC LIMIT 1) l ON true
 WHERE t.id = $1
