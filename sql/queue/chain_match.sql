-- The done turn of the user's with this character whose dialogue hashes to $3, and whether
-- it is its session's latest (no queued, running or done turn after it: failed and dead
-- turns are not part of the dialogue). A session's latest turn is preferred, so a request
-- continues where it can rather than branch; then the most recent, so of two chats whose
-- dialogues are word for word the same, the one used last.
-- $1 user, $2 character, $3 chain hash.
SELECT t.id, t.session_id,
       NOT EXISTS (SELECT 1 FROM turns l
                    WHERE l.session_id = t.session_id AND l.id > t.id
                      AND l.state IN ('queued', 'running', 'done')) AS latest
  FROM turns t
 WHERE t.user_id = $1 AND t.character_id = $2 AND t.chain_hash = $3 AND t.state = 'done'
 ORDER BY latest DESC, t.id DESC
 LIMIT 1
