-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- Stores vectors of model $3 for messages (the lane, its backfill, import); one statement, autocommit.
UPDATE memory_messages m
   SET embedding = v.embedding, embed_model = $3
  FROM unnest($1::bigint[], $2::vector[]) AS v(id, embedding)
 WHERE m.id = v.id
