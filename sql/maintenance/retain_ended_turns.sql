-- Retention of turns that ended without a reply (dead: out of attempts; failed: bad
-- input): their rows and log rows, past the window, at most $2 turns per call. A done turn
-- is kept: its messages reference it and the snapshot fence reads its done_token. Returns
-- (turns, log rows) deleted. $1 retention in hours. One statement: the log rows and their
-- turns go together or not at all.
WITH old AS (
    SELECT id FROM turns t
     WHERE state IN ('dead', 'failed')
       AND finished_at < now() - make_interval(secs => $1 * 3600)
       AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.turn_id = t.id)
     ORDER BY finished_at LIMIT $2
       FOR UPDATE SKIP LOCKED
), logs AS (
    DELETE FROM turn_log l USING old WHERE l.turn_id = old.id RETURNING 1
), gone AS (
    DELETE FROM turns t USING old WHERE t.id = old.id RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM logs)
