-- Saves a context document (one statement: atomic, as seed 003's tmp + rename).
INSERT INTO contexts (session_id, data) VALUES ($1, $2::json)
ON CONFLICT (session_id) DO UPDATE SET data = EXCLUDED.data, updated_at = now()
