-- Stores vectors of model $3 for facts (the lane's backfill, reindex); one statement, autocommit.
UPDATE memories m
   SET embedding = v.embedding, embed_model = $3
  FROM unnest($1::bigint[], $2::bytea[]) AS v(id, embedding)
 WHERE m.id = v.id
