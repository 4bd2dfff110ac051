-- Queues ingest jobs for imported messages (`--extract llm`), each asking for extraction,
-- with the backlog rule applied once per user; autocommit, one statement. Returns the ids
-- of the jobs created.
SELECT kvmem_memory_queue_ingest_many($1::bigint[], '{"extract": true}'::jsonb)
