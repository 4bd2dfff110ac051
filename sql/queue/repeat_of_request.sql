-- The turn a repeated chat request that named no session maps to, if any: the latest turn
-- of the user's with this character queued by a request with this hash, when it is still its
-- session's latest turn and within its lifetime, as in repeat_of.sql: queued or running; or
-- ended less than the retry window ago, and either the request says it is a retry or the
-- turn's answer was never delivered.
-- $1 user, $2 character, $3 request hash, $4 the request is a retry, $5 the retry window in
-- milliseconds.
SELECT t.id, t.session_id
  FROM turns t
 WHERE t.user_id = $1 AND t.character_id = $2 AND t.request_hash = $3
   AND NOT EXISTS (SELECT 1 FROM turns l WHERE l.session_id = t.session_id AND l.id > t.id)
   AND (t.state IN ('queued', 'running')
        OR (t.finished_at > now() - $5::bigint * interval '1 millisecond'
            AND ($4 OR t.delivered_at IS NULL)))
 ORDER BY t.id DESC
 LIMIT 1
