-- The message size of the session's last successful turn.
SELECT u_tokens FROM turn_log WHERE sid = $1 AND status = 'OK' ORDER BY id DESC LIMIT 1
