-- Whether a session has no turn yet. $1 session.
SELECT NOT EXISTS (SELECT 1 FROM turns WHERE session_id = $1)
