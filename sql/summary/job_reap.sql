-- A summary job left running by a dead worker for over $1 seconds is queued again
-- (autocommit, one statement).
UPDATE summary_jobs SET state = 'queued', started_at = NULL
 WHERE state = 'running' AND started_at < now() - make_interval(secs => $1)
