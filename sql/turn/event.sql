-- One exceptional event of a turn (cold start, quarantined snapshot), for ops. Not for a
-- turn erased meanwhile (sql/api/erase.sql): the key-share lock orders it with the erase.
INSERT INTO events (session_id, turn_id, kind, detail)
SELECT $1, $2::bigint, $3, $4
 WHERE $2::bigint IS NULL OR EXISTS (SELECT 1 FROM turns WHERE id = $2::bigint FOR KEY SHARE)
