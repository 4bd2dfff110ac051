-- Who a session belongs to (its latest turn's user and character).
SELECT user_id, character_id FROM turns WHERE session_id = $1 ORDER BY id DESC LIMIT 1
