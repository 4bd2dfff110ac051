-- A stored batch of daily summaries (scope, day, bucket).
SELECT summaries FROM daily_summaries WHERE scope = $1 AND day = $2 AND bucket = $3
