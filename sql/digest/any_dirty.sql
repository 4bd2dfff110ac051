-- Whether any session is marked dirty: a polling rebuilder's cheap look before it opens a
-- transaction.
SELECT EXISTS (SELECT 1 FROM digest_dirty)
