-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- Stores span vectors of model $3 (import, lane, reindex); one statement, autocommit.
UPDATE memory_messages m
   SET span_embedding = v.embedding, span_embed_model = $3
  FROM unnest($1::bigint[], $2::vector[]) AS v(id, embedding)
 WHERE m.id = v.id
