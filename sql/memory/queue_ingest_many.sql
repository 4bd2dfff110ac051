-- Queues ingest jobs for imported messages (`--extract llm`), with the backlog rule;
-- autocommit, one statement.
SELECT kvmem_memory_queue_ingest(id) FROM unnest($1::bigint[]) AS id
