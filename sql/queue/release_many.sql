-- Free a batch of sessions and point each at its next queued turn (none: NULL). Same rule
-- as release_lease.sql, for the turns a batched completion just finished.
-- $1 JSON array of {session_id, fencing_token, turn_id}, $2 the finished turn ids.
UPDATE session_locks l
   SET turn_id = NULL, owner = NULL, expires_at = now(),
       (head_turn_id, head_run_at, head_lane) =
           (SELECT t.id, t.run_at, t.lane FROM turns t
             WHERE t.session_id = l.session_id AND t.state = 'queued'
             ORDER BY t.id LIMIT 1)
  FROM jsonb_to_recordset($1) AS i(session_id text, fencing_token bigint, turn_id bigint)
 WHERE l.session_id = i.session_id AND l.fencing_token = i.fencing_token
   AND i.turn_id = ANY($2)
