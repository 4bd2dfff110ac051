-- The second half of claim_next.sql or claim_next_affinity.sql: lease the sessions they
-- picked, mark their head turns running, and return them.
, lease AS (
    UPDATE session_locks l
       SET turn_id       = n.head_turn_id,
           owner         = $1,
           last_owner    = $1,
           fencing_token = l.fencing_token + 1,
           acquired_at   = now(),
           heartbeat_at  = now(),
           expires_at    = now() + make_interval(secs => $2 / 1000.0)
      FROM next n
     WHERE l.session_id = n.session_id
    RETURNING l.session_id, l.turn_id, l.fencing_token
), claimed AS (
    UPDATE turns t
       SET state = 'running',
           attempts = t.attempts + 1,
           started_at = now(),
           worker_id = $1
      FROM lease
     -- By primary key only: compared as text, the state check cannot match the partial
     -- pending index, which the planner otherwise picks (stale statistics on a table of
     -- finished turns say it is empty) and then hashes every pending turn per claim.
     WHERE t.id = lease.turn_id AND t.state::text = 'queued'
    RETURNING t.id, t.session_id, t.user_id, t.character_id, t.message, t.lane, t.options,
              t.attempts, t.max_attempts, lease.fencing_token
), audit AS (
    INSERT INTO events (session_id, turn_id, kind, detail)
    SELECT session_id, id, 'claimed', jsonb_build_object('worker', $1::text, 'attempt', attempts)
      FROM claimed
)
-- With each claimed turn, its session's last committed turn and the fence its completion
-- carried: the only (turn, fence) a snapshot may hold to be resumed. Read in the claim's own
-- statement, so the turn asks the queue nothing more; the session's lease, taken here, keeps
-- any other turn of the session from committing until this one ends.
SELECT c.*, d.id AS last_done_id, d.done_token AS last_done_token
  FROM claimed c
  LEFT JOIN LATERAL (
      SELECT id, done_token FROM turns
       WHERE session_id = c.session_id AND state = 'done'
       ORDER BY id DESC
       LIMIT 1
  ) d ON true
