-- Does this worker still hold the turn's lease, unexpired? Asked just before a snapshot
-- is written, so a worker that lost its lease leaves the session's good snapshot alone.
-- Not a proof (the worker can stall right after asking): the fence in the snapshot header,
-- checked against turns.done_token at load, is.
-- $1 session, $2 turn, $3 owner, $4 fencing token.
SELECT EXISTS (
    SELECT 1 FROM session_locks
     WHERE session_id = $1 AND turn_id = $2 AND owner = $3 AND fencing_token = $4
       AND expires_at > now()
)
