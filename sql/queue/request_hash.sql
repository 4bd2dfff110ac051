-- Records the hash of the chat request that queued a turn, in the transaction that queued it.
UPDATE turns SET request_hash = $2 WHERE id = $1
