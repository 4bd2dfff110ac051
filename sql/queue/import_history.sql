-- A new session's dialogue from the history a chat request brought: one done turn of origin
-- 'import' per exchange, in order, with the chain hash the request's history has through it,
-- and its dialogue rows, so that the first reply is conditioned on what the user sees and a
-- cold start rebuilds it as it rebuilds any session's.
-- $1 session, $2 user, $3 character, $4 JSON array of {message, reply, hash (hex)}.
WITH input AS (
    SELECT i.*
      FROM ROWS FROM (jsonb_to_recordset($4) AS (message text, reply text, hash text))
           WITH ORDINALITY AS i(message, reply, hash, n)
), imported AS (
    INSERT INTO turns (session_id, user_id, character_id, message, state, attempts, reply,
                       started_at, finished_at, delivered_at, chain_hash, origin)
    SELECT $1, $2, $3, i.message, 'done', 0, i.reply, now(), now(), now(),
           decode(i.hash, 'hex'), 'import'
      FROM input i
     ORDER BY i.n
    RETURNING id, message, reply
)
INSERT INTO messages (session_id, turn_id, role, content)
SELECT $1, d.id, m.role, m.content
  FROM imported d
 CROSS JOIN LATERAL (VALUES (1, 'user', d.message), (2, 'assistant', d.reply)) AS m(n, role, content)
 ORDER BY d.id, m.n
