-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- The nearest of one user's message vectors to the query ($5) by cosine, every vector
-- compared (the second sort key keeps the HNSW index out: exact, and ties broken by id).
-- For users small enough that reading their rows is cheaper than the index; autocommit.
-- Vectors of model $7 only: another model's vector is not comparable.
-- The guild test is spelled out for the planner's estimate (see search_messages_vectors).
SELECT id, (1 - (embedding <=> $5::vector))::float8 AS cosine
  FROM memory_messages
 WHERE user_id = $1
   AND ($2::bigint IS NULL OR character_id = $2 OR character_id IS NULL)
   AND (guild_id = $3 OR (guild_id IS NULL AND $3::text IS NULL))
   AND ($4::timestamptz IS NULL OR at <= $4)
   AND embedding IS NOT NULL AND embed_model = $7
 ORDER BY embedding <=> $5::vector, id
 LIMIT $6
