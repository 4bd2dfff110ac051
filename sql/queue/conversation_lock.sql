-- The lock of one user's chats with one character, held to the end of the caller's
-- transaction: a request that names no session is matched, branched or started, and its
-- turn queued, with no other such request of theirs in between (two copies of one request
-- arriving together make one turn).
-- $1 user, $2 character.
SELECT pg_advisory_xact_lock(hashtextextended('kvmem-conversation:' || $1 || ':' || $2::text, 0))
