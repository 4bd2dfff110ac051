-- Free the session and point it at its next queued turn (none: NULL). The token stays,
-- so it keeps growing. Runs after the turn's own state change in the same transaction,
-- so a retried turn is seen as queued and stays the head.
-- $1 session, $2 fencing token.
UPDATE session_locks l
   SET turn_id = NULL, owner = NULL, expires_at = now(),
       (head_turn_id, head_run_at, head_lane) =
           (SELECT t.id, t.run_at, t.lane FROM turns t
             WHERE t.session_id = $1 AND t.state = 'queued'
             ORDER BY t.id LIMIT 1)
 WHERE l.session_id = $1 AND l.fencing_token = $2
