-- Replay: did the source session's facts change after its first turn was queued? A replay
-- copies the facts as they are now, so its digest can differ from the original's.
SELECT EXISTS (
    SELECT 1 FROM facts f
     WHERE f.session_id = $1
       AND f.updated_at > (SELECT min(t.created_at) FROM turns t WHERE t.session_id = $1))
