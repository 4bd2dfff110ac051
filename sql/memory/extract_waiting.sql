-- Queued jobs that ask for extraction (`import --extract llm`), for `kvmem memory work`
-- to say what it left to a lane with an extraction model; autocommit read.
SELECT count(*) FROM memory_jobs
 WHERE state = 'queued' AND coalesce((payload ->> 'extract')::boolean, false)
