-- Demo (recall scene): the session's committed KV dialogue (token ids and segment table).
SELECT token_ids, segments FROM session_kv WHERE session_id = $1
