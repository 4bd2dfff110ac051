-- The session's recorded KV dialogue, for an exact cold rebuild. $1 session id.
SELECT user_id, character_id, turn_id, model_sha, token_ids, segments, digest_version
  FROM session_kv
 WHERE session_id = $1
