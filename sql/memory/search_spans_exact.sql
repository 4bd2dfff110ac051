-- The nearest of one user's span vectors to the query ($5), every vector compared (the
-- second sort key keeps the HNSW index out: exact, ties broken by id), each spread to
-- the messages of its span: a message scores the best span it sits in. $6 spans.
-- Autocommit read, for users small enough that reading their rows beats the index.
WITH hits AS (
    SELECT id, session_id, at, (1 - (span_embedding <=> $5::vector))::float8 AS cosine
      FROM memory_messages
     WHERE user_id = $1
       AND ($2::bigint IS NULL OR character_id = $2 OR character_id IS NULL)
       AND (guild_id = $3 OR (guild_id IS NULL AND $3::text IS NULL))
       AND ($4::timestamptz IS NULL OR at <= $4)
       AND span_embedding IS NOT NULL
     ORDER BY span_embedding <=> $5::vector, id
     LIMIT $6
)
SELECT p.id, max(h.cosine)::float8 AS cosine
  FROM hits h
 CROSS JOIN LATERAL (
       SELECT q.id
         FROM memory_messages q
        WHERE q.user_id = $1 AND q.session_id = h.session_id
          AND (q.at, q.id) <= (h.at, h.id)
        ORDER BY q.at DESC, q.id DESC
        LIMIT 5) AS p
 GROUP BY p.id
