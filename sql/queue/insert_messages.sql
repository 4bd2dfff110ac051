-- The turn's user message and the assistant reply join the dialogue.
-- $1 session, $2 turn id, $3 user message, $4 reply.
INSERT INTO messages (session_id, turn_id, role, content)
VALUES ($1, $2, 'user', $3), ($1, $2, 'assistant', $4)
