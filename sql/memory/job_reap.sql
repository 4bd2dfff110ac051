-- Puts memory jobs back in the queue whose worker died mid-job (running for longer than
-- $1 seconds); autocommit, one statement. The per-user running index keeps this scan small.
UPDATE memory_jobs SET state = 'queued'
 WHERE state = 'running' AND started_at < now() - make_interval(secs => $1)
RETURNING id
