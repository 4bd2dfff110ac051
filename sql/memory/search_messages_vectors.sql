-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- The nearest of one user's message vectors to the query ($5) by cosine, from the HNSW
-- index: the caller's transaction sets hnsw.ef_search and hnsw.iterative_scan, so that
-- rows of other users skipped by the filter do not leave the list short. $6 rows, of
-- model $7 only (another model's vector is not comparable). The
-- guild test is spelled out: `IS NOT DISTINCT FROM` is estimated at one row, and the
-- plan's cost then called for JIT compilation (135-160 ms per search, for a 6 ms scan).
SELECT id, (1 - (embedding <=> $5::vector))::float8 AS cosine
  FROM memory_messages
 WHERE user_id = $1
   AND ($2::bigint IS NULL OR character_id = $2 OR character_id IS NULL)
   AND (guild_id = $3 OR (guild_id IS NULL AND $3::text IS NULL))
   AND ($4::timestamptz IS NULL OR at <= $4)
   AND embedding IS NOT NULL AND embed_model = $7
 ORDER BY embedding <=> $5::vector
 LIMIT $6
