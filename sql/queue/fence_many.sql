-- Inside a completion transaction: lock the lease rows of a batch of turns and keep the
-- ones this worker still holds. Rows are locked in session order so two transactions
-- locking overlapping sessions cannot deadlock.
-- $1 JSON array of {turn_id, session_id, fencing_token, owner}.
SELECT i.turn_id
  FROM jsonb_to_recordset($1) AS i(turn_id bigint, session_id text, fencing_token bigint, owner text)
  JOIN session_locks l
    ON l.session_id = i.session_id AND l.fencing_token = i.fencing_token
   AND l.owner = i.owner AND l.turn_id = i.turn_id
 ORDER BY l.session_id
   FOR UPDATE OF l
