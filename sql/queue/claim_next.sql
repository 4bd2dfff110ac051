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
)
