-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- What `kvmem memory reindex` has to embed for model $2 ($1 NULL = every user): messages
-- without a vector of it and messages without a span vector of it (none yet, or another
-- model's); reindex_todo_facts.sql counts the facts. For its progress bar; autocommit read.
SELECT (SELECT count(*) FROM memory_messages
         WHERE ($1::text IS NULL OR user_id = $1)
           AND (embedding IS NULL OR embed_model IS DISTINCT FROM $2))::bigint,
       (SELECT count(*) FROM memory_messages
         WHERE ($1::text IS NULL OR user_id = $1)
           AND (span_embedding IS NULL OR span_embed_model IS DISTINCT FROM $2))::bigint
