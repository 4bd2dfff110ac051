-- When the session's KV last received the digest.
SELECT max(finished_at) FROM turn_log WHERE sid = $1 AND digest_injected AND status = 'OK'
