-- A new session's id, for a chat request that named none and branched or started one.
SELECT gen_random_uuid()::text
