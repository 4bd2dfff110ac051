-- Replay: the source session's completed turns, in order.
SELECT user_id, character_id, message, reply FROM turns
WHERE session_id = $1 AND state = 'done' ORDER BY id
