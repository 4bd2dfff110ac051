-- Every stored vector of one user's messages in scope, for brute-force cosine in the
-- worker (pgvector is not packaged here); autocommit read.
SELECT id, at, embedding
  FROM memory_messages
 WHERE user_id = $1
   AND ($2::bigint IS NULL OR character_id = $2 OR character_id IS NULL)
   AND guild_id IS NOT DISTINCT FROM $3
   AND ($4::timestamptz IS NULL OR at <= $4)
   AND embedding IS NOT NULL
