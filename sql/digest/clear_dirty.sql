-- Clear a dirty marker only if no fact changed since we read it ($2 = marked_at seen).
DELETE FROM digest_dirty WHERE session_id = $1 AND marked_at = $2
