-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- The query's ($3) cosine with chosen messages of one user (candidates of the other legs
-- that the vector list did not reach), where their vector is of the query's model $4;
-- autocommit read.
SELECT id, (1 - (embedding <=> $3::vector))::float8 AS cosine
  FROM memory_messages
 WHERE user_id = $1 AND id = ANY($2::bigint[]) AND embedding IS NOT NULL
   AND embed_model = $4
