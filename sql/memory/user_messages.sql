-- How many messages one user has (the BM25 statistics keep the count); autocommit read.
SELECT coalesce((SELECT docs FROM memory_lexicon_users WHERE user_id = $1), 0)::bigint
