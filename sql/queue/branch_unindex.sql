-- A branch's copied dialogue rows are already in long-term memory under the turns they copy:
-- the memory rows the messages trigger made for the copies are removed, and their ingest
-- jobs with them (ON DELETE CASCADE), so that memory holds each exchange once.
-- $1 user, $2 the copies' turn ids.
DELETE FROM memory_messages m
 WHERE m.user_id = $1
   AND m.message_id IN (SELECT 'turn:' || t || ':' || r
                          FROM unnest($2::bigint[]) t, (VALUES ('user'), ('assistant')) v(r))
