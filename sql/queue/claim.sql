-- Claim the next runnable turn and take its session's lease, in one statement.
-- $1 owner (worker id), $2 lease length in ms, $3 lanes to take from.
--
-- A turn is runnable when it is queued, due, the oldest pending turn of its
-- session (so a retried turn keeps the head), and no live lease covers the
-- session. SKIP LOCKED lets many workers scan at once without waiting on each
-- other; the unique index on running turns backs this up inside the database.
WITH next AS (
    SELECT t.id, t.session_id
      FROM turns t
     WHERE t.state = 'queued'
       AND t.run_at <= now()
       AND t.lane = ANY($3::text[])
       AND NOT EXISTS (
             SELECT 1 FROM turns e
              WHERE e.session_id = t.session_id
                AND e.state IN ('queued', 'running')
                AND e.id < t.id)
       AND NOT EXISTS (
             SELECT 1 FROM session_locks l
              WHERE l.session_id = t.session_id
                AND l.turn_id IS NOT NULL
                AND l.expires_at > now())
     ORDER BY t.id
     LIMIT 1
       FOR UPDATE OF t SKIP LOCKED
), lease AS (
    INSERT INTO session_locks AS l
           (session_id, turn_id, owner, fencing_token, acquired_at, heartbeat_at, expires_at)
    SELECT n.session_id, n.id, $1, 1, now(), now(), now() + make_interval(secs => $2 / 1000.0)
      FROM next n
    ON CONFLICT (session_id) DO UPDATE
       SET turn_id       = EXCLUDED.turn_id,
           owner         = EXCLUDED.owner,
           fencing_token = l.fencing_token + 1,
           acquired_at   = now(),
           heartbeat_at  = now(),
           expires_at    = EXCLUDED.expires_at
     WHERE l.turn_id IS NULL OR l.expires_at <= now()
    RETURNING l.session_id, l.fencing_token
)
UPDATE turns t
   SET state = 'running',
       attempts = t.attempts + 1,
       started_at = now(),
       worker_id = $1
  FROM next n
  JOIN lease ON lease.session_id = n.session_id
 WHERE t.id = n.id
RETURNING t.id, t.session_id, t.user_id, t.character_id, t.message, t.lane,
          t.attempts, t.max_attempts, lease.fencing_token
