-- The turn a repeated chat request maps to, if any: the session's latest turn, when it is
-- this user's with this character, was queued by a request with this hash, and is within
-- its lifetime: queued or running; or ended less than the retry window ago, and either
-- the request says it is a retry or the turn's answer was never delivered.
-- $1 session, $2 user, $3 character, $4 request hash, $5 the request is a retry,
-- $6 the retry window in milliseconds.
SELECT t.id
  FROM (SELECT id, user_id, character_id, request_hash, state, finished_at, delivered_at
          FROM turns WHERE session_id = $1 ORDER BY id DESC LIMIT 1) t
 WHERE t.user_id = $2 AND t.character_id = $3 AND t.request_hash = $4
   AND (t.state IN ('queued', 'running')
        OR (t.finished_at > now() - $6::bigint * interval '1 millisecond'
            AND ($5 OR t.delivered_at IS NULL)))
