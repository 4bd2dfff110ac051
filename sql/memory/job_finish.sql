-- Records a memory job's outcome (autocommit, one statement).
UPDATE memory_jobs
   SET state = $2, result = $3, error = $4, finished_at = now()
 WHERE id = $1
