-- The snapshot scopes erased since $1 (null: all still remembered), oldest first, with
-- when: a worker's sweep removes what its own store holds of them that was written before
-- then (autocommit).
SELECT scope, erased_at FROM erased_scopes
 WHERE $1::timestamptz IS NULL OR erased_at > $1
 ORDER BY erased_at, scope
