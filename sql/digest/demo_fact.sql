-- Demo: a world-state fact for the scene's session.
INSERT INTO facts (session_id, type, key, value, status, started_at, updated_at)
VALUES ($1, $2, $3, $4, 'active', NOW(), NOW())
