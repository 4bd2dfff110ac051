-- The session's last committed turn and the fencing token its completion carried: the only
-- (turn, token) pair a snapshot may hold to be resumed.
-- $1 session.
SELECT id, done_token FROM turns
 WHERE session_id = $1 AND state = 'done'
 ORDER BY id DESC
 LIMIT 1
