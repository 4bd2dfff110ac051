-- Branches a session: copies its done turns up to and including $3, with their chain hashes
-- and their dialogue rows, into the new session $1, as turns of origin 'branch' that name the
-- turn they copy. The new session's stored dialogue is then the old one up to there, which a
-- cold start rebuilds as it rebuilds any session's; the old session is left as it was.
-- Returns the copies' ids. $1 new session, $2 the session branched, $3 the turn branched at.
WITH copied AS (
    INSERT INTO turns (session_id, user_id, character_id, message, lane, state, attempts,
                       reply, started_at, finished_at, delivered_at, chain_hash, origin,
                       copied_from)
    SELECT $1, s.user_id, s.character_id, s.message, s.lane, 'done', 0,
           s.reply, now(), now(), now(), s.chain_hash, 'branch', s.id
      FROM turns s
     WHERE s.session_id = $2 AND s.state = 'done' AND s.id <= $3
     ORDER BY s.id
    RETURNING id, copied_from
), dialogue AS (
    INSERT INTO messages (session_id, turn_id, role, content)
    SELECT $1, c.id, m.role, m.content
      FROM copied c
      JOIN messages m ON m.turn_id = c.copied_from
     ORDER BY c.id, m.role = 'assistant'
)
SELECT id FROM copied ORDER BY id
