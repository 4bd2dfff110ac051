-- Inside a search's transaction: enough index candidates for the list the search wants
-- ($1), an iterative scan that keeps going while the user filter drops rows, and no
-- sort: this path is taken for a user too large to sort, so the planner must not pick
-- "read the user's rows and sort them" (its estimate for a small table says it would).
SELECT set_config('hnsw.ef_search', $1::text, true),
       set_config('hnsw.iterative_scan', 'relaxed_order', true),
       set_config('enable_sort', 'off', true)
