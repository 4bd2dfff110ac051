-- Demo (memory scene): whether the user's rolling summary job has finished (made or failed).
SELECT 1 FROM summary_jobs
 WHERE user_id = $1 AND character_id = $2 AND kind = 'rolling' AND state IN ('done', 'failed')
 LIMIT 1
