-- When the session's digest was marked dirty (NULL when clean).
SELECT marked_at FROM digest_dirty WHERE session_id = $1
