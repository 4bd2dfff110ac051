-- The query's ($3) cosine with chosen messages of one user (candidates of the other legs
-- that the vector list did not reach); autocommit read.
SELECT id, (1 - (embedding <=> $3::vector))::float8 AS cosine
  FROM memory_messages
 WHERE user_id = $1 AND id = ANY($2::bigint[]) AND embedding IS NOT NULL
