-- Claim the dirty markers of these sessions that no transaction holds, by deleting them in
-- the rebuild's transaction: a fact write that commits after the rebuild's read marks the
-- session again. A marker held by a write still in flight is left alone; that write's
-- NOTIFY comes after its commit. $1 session ids.
DELETE FROM digest_dirty
 WHERE session_id IN (SELECT session_id FROM digest_dirty
                       WHERE session_id = ANY($1)
                         FOR UPDATE SKIP LOCKED)
RETURNING session_id
