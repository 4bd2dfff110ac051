-- Records that a session's digest changed version.
INSERT INTO events (session_id, kind, detail) VALUES ($1, 'digest_rebuilt', $2)
