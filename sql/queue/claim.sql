-- Claim up to $4 runnable turns, each from a different session, and take their leases.
-- $1 owner (worker id), $2 lease length in ms, $3 lanes to take from, $4 batch size.
--
-- A session is ready when it has a head turn (its oldest queued turn), no lease, and the
-- head is due. The partial index on ready sessions makes this an index walk in head order;
-- SKIP LOCKED lets many workers walk it at once without waiting on each other. The unique
-- index on running turns backs the one-turn-per-session rule inside the database.
WITH next AS (
    SELECT l.session_id, l.head_turn_id
      FROM session_locks l
     WHERE l.head_turn_id IS NOT NULL
       AND l.turn_id IS NULL
       AND l.head_run_at <= now()
       AND l.head_lane = ANY($3::text[])
     ORDER BY l.head_turn_id
     LIMIT $4
       FOR UPDATE SKIP LOCKED
), lease AS (
    UPDATE session_locks l
       SET turn_id       = n.head_turn_id,
           owner         = $1,
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
    RETURNING t.id, t.session_id, t.user_id, t.character_id, t.message, t.lane,
              t.attempts, t.max_attempts, lease.fencing_token
), audit AS (
    INSERT INTO events (session_id, turn_id, kind, detail)
    SELECT session_id, id, 'claimed', jsonb_build_object('worker', $1::text, 'attempt', attempts)
      FROM claimed
)
SELECT * FROM claimed
