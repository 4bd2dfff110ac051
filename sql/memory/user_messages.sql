-- How many messages one user has (the BM25 statistics keep the count), and how many
-- vectors the message index holds in all (its planner statistics; 0 before the first
-- ANALYZE or without the index): the two sizes that decide exact or index. Then how many of
-- the user's messages have a vector of model $2 (an index-only scan of
-- memory_messages_user_model_idx): the others are left out of the vector legs. Last, the
-- user's current facts without a vector of model $2, which the search scores lexically
-- (the memory lane fills them). Autocommit read.
SELECT coalesce((SELECT docs FROM memory_lexicon_users WHERE user_id = $1), 0)::bigint,
       greatest(coalesce((SELECT reltuples FROM pg_class
                           WHERE oid = to_regclass('memory_messages_embedding_hnsw')), 0), 0)::float8,
       (SELECT count(*) FROM memory_messages WHERE user_id = $1 AND embed_model = $2)::bigint,
       (SELECT count(*) FROM memories
         WHERE user_id = $1 AND status = 'ACTIVE' AND valid_to IS NULL
           AND embed_model IS DISTINCT FROM $2)::bigint
