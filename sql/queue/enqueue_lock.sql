-- The session's enqueue lock, the one kvmem_enqueue_turn takes (sql/api/enqueue_turn.sql),
-- held to the end of the caller's transaction: a lookup of the session's latest turn and
-- the enqueue after it see no other enqueue of the session in between.
SELECT pg_advisory_xact_lock(hashtextextended('kvmem:' || $1, 0))
