-- Leases that expired: their worker died or stalled. Locked so concurrent reapers
-- (one per worker) never handle the same session twice.
SELECT session_id, turn_id, fencing_token
  FROM session_locks
 WHERE turn_id IS NOT NULL AND expires_at <= now()
 LIMIT 500
   FOR UPDATE SKIP LOCKED
