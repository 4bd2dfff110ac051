-- Mark running turns done with their replies (the chain hash is the trigger's,
-- sql/api/chain.sql, the same for a previous release's completion), add the user and assistant messages, record
-- the events and announce each on kvmem_turn_done (delivered at commit). Runs only for
-- the turns fence_many.sql kept.
-- $1 JSON array of {turn_id, session_id, fencing_token, message, reply}, $2 the fenced
-- turn ids. done_token records which attempt's snapshot is the trusted one.
WITH input AS (
    SELECT i.*
      FROM jsonb_to_recordset($1) AS i(turn_id bigint, session_id text, fencing_token bigint, message text, reply text)
     WHERE i.turn_id = ANY($2)
), done AS (
    UPDATE turns t
       SET state = 'done', reply = i.reply, error = NULL, finished_at = now(),
           done_token = i.fencing_token
      FROM input i
     -- By primary key only (see claim.sql: the text comparison keeps the planner off the
     -- partial pending index).
     WHERE t.id = i.turn_id AND t.state::text = 'running'
    RETURNING t.id, t.session_id
), dialogue AS (
    INSERT INTO messages (session_id, turn_id, role, content)
    SELECT d.session_id, d.id, m.role, m.content
      FROM done d
      JOIN input i ON i.turn_id = d.id
     CROSS JOIN LATERAL (VALUES (1, 'user', i.message), (2, 'assistant', i.reply)) AS m(n, role, content)
     ORDER BY d.id, m.n
), audit AS (
    INSERT INTO events (session_id, turn_id, kind)
    SELECT session_id, id, 'completed' FROM done
)
SELECT d.id, kvmem_notify_turn_done(d.id, d.session_id, 'done')::text AS notified
  FROM done d
