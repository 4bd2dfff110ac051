-- Scale-out with snapshots in an object store.
-- Claim affinity: the worker that ran a session's last turn holds its snapshot in its local
-- cache, so claims prefer it. Not indexed, so claims and releases stay heap-only updates.
ALTER TABLE session_locks ADD COLUMN last_owner text;
-- Where a warm turn's snapshot came from: local (files, no object store), cache (this
-- worker's cache in front of the object store) or remote (read from the object store).
-- NULL for a cold start.
ALTER TABLE turn_log ADD COLUMN kv_source text;
