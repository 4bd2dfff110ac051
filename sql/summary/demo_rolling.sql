-- Demo (memory scene): the newest rolling summary and how long the model took.
SELECT content, message_count, elapsed_ms FROM rolling_summaries
 WHERE user_id = $1 AND character_id = $2 ORDER BY id DESC LIMIT 1
