-- Facts without a vector of model $4 (none, or another model's), oldest first, for
-- `kvmem memory reindex`; $1 NULL = every user; ids above $2; $3 rows. Autocommit read.
SELECT id, fact_type, text, evidence_text
  FROM memories
 WHERE (embedding IS NULL OR embed_model IS DISTINCT FROM $4)
   AND ($1::text IS NULL OR user_id = $1) AND id > $2
 ORDER BY id
 LIMIT $3
