-- A close job that ran early (the session saw activity since it was claimed) goes back to
-- the queue, due at the new idle deadline (autocommit, one statement).
UPDATE summary_jobs SET state = 'queued', run_at = $2, started_at = NULL WHERE id = $1
