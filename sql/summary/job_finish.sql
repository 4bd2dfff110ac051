-- Records a summary job's end state and result (autocommit, one statement).
UPDATE summary_jobs
   SET state = $2, result = $3, error = $4, finished_at = now()
 WHERE id = $1
