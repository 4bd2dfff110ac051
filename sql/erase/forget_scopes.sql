-- Forgets scopes erased longer ago than $1 seconds: every worker has swept them by then
-- (autocommit, one statement).
DELETE FROM erased_scopes WHERE erased_at < now() - make_interval(secs => $1)
