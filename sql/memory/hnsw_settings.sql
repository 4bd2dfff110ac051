-- Inside a search's transaction: enough index candidates for the list the search wants
-- ($1), and an iterative scan that keeps going while the user filter drops rows.
SELECT set_config('hnsw.ef_search', $1::text, true),
       set_config('hnsw.iterative_scan', 'relaxed_order', true)
