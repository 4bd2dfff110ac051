-- A few of one user's facts ($1) with no vector at all, oldest first, at most $2: the
-- memory lane embeds them beside its job (a search only reads, and scores them lexically
-- meanwhile). Another model's vector waits for `kvmem memory reindex`. Autocommit read.
SELECT id, fact_type, text, evidence_text
  FROM memories
 WHERE user_id = $1 AND embedding IS NULL
 ORDER BY id
 LIMIT $2
