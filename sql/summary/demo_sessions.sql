-- Demo (memory scene): the user and character's summary sessions, oldest first.
SELECT id, started_at, ended_at, turn_count FROM summary_sessions
 WHERE user_id = $1 AND character_id = $2 ORDER BY id
