-- A batch of reply deltas from this worker's publisher: stored for late readers and
-- notified on each turn's and session's channel, outside any turn's transaction.
-- $1 JSON array of {turn_id, session_id, attempt, seq, text, done, meta, payload}.
SELECT kvmem_stream_publish($1)
