-- A stored days 2-7 summary (scope, user, end date).
SELECT summary FROM historical_summaries WHERE scope = $1 AND user_id = $2 AND end_date = $3
