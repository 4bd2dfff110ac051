-- The snapshot scopes erased and still remembered: a worker's sweep removes whatever its
-- own store holds of them (autocommit).
SELECT scope FROM erased_scopes ORDER BY scope
