-- Log retention: the oldest turn_log rows past the window, at most $2 per call so the
-- reaper tick stays short. $1 retention in hours. Autocommit: each batch its own.
DELETE FROM turn_log
 WHERE id IN (SELECT id FROM turn_log
               WHERE finished_at < now() - make_interval(secs => $1 * 3600)
               ORDER BY finished_at LIMIT $2)
