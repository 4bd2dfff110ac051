-- Claim up to $1 dirty markers of any sessions that no transaction holds (a polling
-- rebuilder's batch; see claim.sql for why claiming is deleting).
DELETE FROM digest_dirty
 WHERE session_id IN (SELECT session_id FROM digest_dirty
                       LIMIT $1
                         FOR UPDATE SKIP LOCKED)
RETURNING session_id
