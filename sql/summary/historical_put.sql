-- Stores a days 2-7 summary (autocommit).
INSERT INTO historical_summaries (scope, user_id, end_date, summary, elapsed_ms)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (scope, user_id, end_date) DO NOTHING
