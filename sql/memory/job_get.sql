-- One memory job by id, within its user (autocommit read).
SELECT id, kind, state, result, error FROM memory_jobs WHERE id = $1 AND user_id = $2
