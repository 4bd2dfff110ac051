-- Claims the oldest queued memory job of a user with nothing running (autocommit, one
-- statement). Per-user order: a job waits for its user's older jobs. The unique index on
-- running jobs per user turns a racing second claim into an error, never a double run.
-- $1: whether this lane has an extraction model. A job that asks for extraction waits for
-- a lane that has one (and its user's later jobs wait behind it).
WITH next AS (
    SELECT j.id
      FROM memory_jobs j
     WHERE j.state = 'queued'
       AND ($1::boolean OR NOT coalesce((j.payload ->> 'extract')::boolean, false))
       AND NOT EXISTS (SELECT 1 FROM memory_jobs r WHERE r.user_id = j.user_id AND r.state = 'running')
       AND NOT EXISTS (SELECT 1 FROM memory_jobs e
                        WHERE e.user_id = j.user_id AND e.state = 'queued' AND e.id < j.id)
     ORDER BY j.id
     LIMIT 1
       FOR UPDATE SKIP LOCKED
)
UPDATE memory_jobs j
   SET state = 'running', attempts = j.attempts + 1, started_at = now()
  FROM next
 WHERE j.id = next.id
RETURNING j.id, j.user_id, j.character_id, j.guild_id, j.kind, j.memory_message_id, j.payload
