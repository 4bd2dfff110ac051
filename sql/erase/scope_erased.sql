-- Was this snapshot scope erased? Asked by a worker whose turn lost its fence, before it
-- leaves the snapshot it wrote. $1 scope key.
SELECT EXISTS (SELECT 1 FROM erased_scopes WHERE scope = $1)
