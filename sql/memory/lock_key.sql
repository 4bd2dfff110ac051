-- Serialises writers of one memory key in one scope for the rest of the caller's
-- transaction (the upsert's), so concurrent same-key writes queue instead of racing.
SELECT pg_advisory_xact_lock(hashtextextended($1, 0))
