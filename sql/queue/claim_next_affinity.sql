-- Claim up to $4 runnable turns like claim_next.sql, preferring sessions whose last turn
-- this worker ran (their snapshot is in its cache). $5 is the affinity wait in ms: a
-- session is ready since its head became due or its last lease ended, whichever is later;
-- another worker's session is left to that worker until it has been ready for $5 ms, and
-- this worker's own sessions count as ready $5 ms earlier. So no session waits more than
-- about $5 ms beyond its FIFO place, and per-session order is untouched (only heads are
-- claimed). The sort reads every ready session: fine for LLM turns, which is where a
-- cache matters; claim_next.sql keeps its index walk for the rest.
-- The conditions are on the locked row itself, so a row another worker leased meanwhile
-- is re-checked and skipped, as in claim_next.sql.
WITH next AS (
    SELECT l.session_id, l.head_turn_id
      FROM session_locks l
     WHERE l.head_turn_id IS NOT NULL
       AND l.turn_id IS NULL
       AND l.head_run_at <= now()
       AND l.head_lane = ANY($3::text[])
       AND (l.last_owner IS NULL
            OR l.last_owner = $1
            OR greatest(l.head_run_at, l.expires_at) <= now() - make_interval(secs => $5 / 1000.0))
     ORDER BY greatest(l.head_run_at, l.expires_at)
                - CASE WHEN l.last_owner = $1 THEN make_interval(secs => $5 / 1000.0)
                       ELSE interval '0' END,
              l.head_turn_id
     LIMIT $4
       FOR UPDATE SKIP LOCKED
)
