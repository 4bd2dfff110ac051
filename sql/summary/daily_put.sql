-- Stores a batch of daily summaries; a racing worker's twin keeps the first (autocommit).
INSERT INTO daily_summaries (scope, day, bucket, summaries, elapsed_ms)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (scope, day, bucket) DO NOTHING
