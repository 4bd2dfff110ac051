-- After a reap: invalidate the old owner's token and point the session at its head again.
-- $1 session, $2 the token the dead owner held.
UPDATE session_locks l
   SET fencing_token = l.fencing_token + 1,
       turn_id = NULL, owner = NULL, expires_at = now(),
       (head_turn_id, head_run_at, head_lane) =
           (SELECT t.id, t.run_at, t.lane FROM turns t
             WHERE t.session_id = $1 AND t.state = 'queued'
             ORDER BY t.id LIMIT 1)
 WHERE l.session_id = $1 AND l.fencing_token = $2
