-- Inside a search's transaction: enough index candidates for the list the search wants
-- ($1), an iterative scan that keeps going while the user filter drops rows, and no
-- sort: this path is taken for a user too large to sort, so the planner must not pick
-- "read the user's rows and sort them" (its estimate for a small table says it would).
-- No JIT: the index scan's estimated cost (the whole index, before the LIMIT) can pass
-- the JIT thresholds, and compiling took 135-160 ms for a scan of 6 ms.
SELECT set_config('hnsw.ef_search', $1::text, true),
       set_config('hnsw.iterative_scan', 'relaxed_order', true),
       set_config('enable_sort', 'off', true),
       set_config('jit', 'off', true)
