-- Give a claimed turn back untouched (graceful shutdown): the attempt is not counted.
-- Runs after fence.sql; release_lease.sql follows in the same transaction.
-- $1 turn id.
WITH released AS (
    UPDATE turns
       SET state = 'queued', attempts = GREATEST(attempts - 1, 0), worker_id = NULL
     WHERE id = $1 AND state = 'running'
    RETURNING id, session_id
), audit AS (
    INSERT INTO events (session_id, turn_id, kind)
    SELECT session_id, id, 'released' FROM released
)
SELECT id FROM released
