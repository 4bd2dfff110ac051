-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- How many messages one user has (the BM25 statistics keep the count), and how many
-- vectors the message index holds in all (its planner statistics; 0 before the first
-- ANALYZE or without the index): the two sizes that decide exact or index. Then how many of
-- the user's messages have a vector of model $2 (an index-only scan of
-- memory_messages_user_model_idx): the others are left out of the vector legs. The user's
-- facts without a vector are counted by facts_without_vector.sql. Autocommit read.
SELECT coalesce((SELECT docs FROM memory_lexicon_users WHERE user_id = $1), 0)::bigint,
       greatest(coalesce((SELECT reltuples FROM pg_class
                           WHERE oid = to_regclass('memory_messages_embedding_hnsw')), 0), 0)::float8,
       (SELECT count(*) FROM memory_messages WHERE user_id = $1 AND embed_model = $2)::bigint
