-- The user's ($1) current facts without a vector of model $2, which the search scores
-- lexically (the memory lane fills them). Autocommit read.
SELECT count(*)
  FROM memories
 WHERE user_id = $1 AND status = 'ACTIVE' AND valid_to IS NULL
   AND embed_model IS DISTINCT FROM $2
