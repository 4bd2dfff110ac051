-- A session's summary, or the error that replaced it (autocommit).
INSERT INTO session_summaries (session_id, user_id, character_id, status, summary, error,
                               attempts, raw_answers, elapsed_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING id
