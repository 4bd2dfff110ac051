-- The facts `kvmem memory reindex` has to embed for model $2 ($1 NULL = every user): those
-- without a vector of it (none yet, or another model's). Autocommit read.
SELECT count(*)
  FROM memories
 WHERE ($1::text IS NULL OR user_id = $1)
   AND (embedding IS NULL OR embed_model IS DISTINCT FROM $2)
