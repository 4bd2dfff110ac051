-- A new rolling summary version (inside the rolling transaction): the history row, linked
-- to the version it replaces.
INSERT INTO rolling_summaries (user_id, character_id, session_id, previous_id, message_count,
                               last_message_id, content, elapsed_ms)
VALUES ($1, $2, $3,
        (SELECT max(id) FROM rolling_summaries WHERE user_id = $1 AND character_id = $2),
        $4, $5, $6, $7)
RETURNING id
