-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- The nearest of one user's span vectors to the query ($5) from the HNSW index (the
-- caller's transaction sets hnsw.ef_search and hnsw.iterative_scan, so that rows of other
-- users skipped by the filter do not leave the list short), spread to the
-- messages of their spans by spread_spans.sql, which follows. $6 spans, of
-- model $7 only (another model's vector is not comparable).
WITH hits AS (
    SELECT id, session_id, at, (1 - (span_embedding <=> $5::vector))::float8 AS cosine
      FROM memory_messages
     WHERE user_id = $1
       AND ($2::bigint IS NULL OR character_id = $2 OR character_id IS NULL)
       AND (guild_id = $3 OR (guild_id IS NULL AND $3::text IS NULL))
       AND ($4::timestamptz IS NULL OR at <= $4)
       AND span_embedding IS NOT NULL AND span_embed_model = $7
     ORDER BY span_embedding <=> $5::vector
     LIMIT $6
)
