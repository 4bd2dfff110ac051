-- Follows a `hits` CTE of span ids (search_spans_exact.sql or search_spans_index.sql):
-- each span spread to its messages (the span's message and the four before it in its
-- session); a message scores the best span it sits in.
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
