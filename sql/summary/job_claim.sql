-- Claims the next due summary job ($1 = now) of a user with nothing running (autocommit,
-- one statement). Closes go first (no model, and they unlock session summaries); then by
-- due time. The unique index on running jobs per user turns a racing claim into an error.
WITH next AS (
    SELECT j.id
      FROM summary_jobs j
     WHERE j.state = 'queued'
       AND j.run_at <= $1
       AND NOT EXISTS (SELECT 1 FROM summary_jobs r WHERE r.user_id = j.user_id AND r.state = 'running')
     ORDER BY (j.kind = 'close') DESC, j.run_at, j.id
     LIMIT 1
       FOR UPDATE SKIP LOCKED
)
UPDATE summary_jobs j
   SET state = 'running', attempts = j.attempts + 1, started_at = now()
  FROM next
 WHERE j.id = next.id
RETURNING j.id, j.kind, j.user_id, j.character_id, j.session_id, j.payload, j.run_at
