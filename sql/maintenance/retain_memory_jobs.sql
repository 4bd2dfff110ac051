-- Job retention: memory jobs in one of the states $2 that finished more than $1 hours
-- ago, at most $3 per call. The literal state list lets the partial index serve it.
DELETE FROM memory_jobs
 WHERE id IN (SELECT id FROM memory_jobs
               WHERE state IN ('done', 'dropped', 'failed') AND state = ANY($2)
                 AND finished_at < now() - make_interval(secs => $1 * 3600)
               ORDER BY finished_at LIMIT $3)
