-- Replay: gives the replay session the source session's facts.
INSERT INTO facts (session_id, type, key, value, status, expires_at)
SELECT $2, type, key, value, status, expires_at FROM facts WHERE session_id = $1
ON CONFLICT (session_id, type, key) DO NOTHING
