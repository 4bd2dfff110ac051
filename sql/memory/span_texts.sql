-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- Messages without a span vector (with $5, also those whose span vector is not of model $4:
-- reindex after a switch), oldest first, each with its span: the message and
-- up to four before it in its session, "Speaker: text" oldest first ($1 NULL = every
-- user; ids above $2; $3 rows). Autocommit read.
SELECT m.id, s.span
  FROM memory_messages m
 CROSS JOIN LATERAL (
       SELECT string_agg(p.speaker || ': ' || p.text, ' ' ORDER BY p.at, p.id) AS span
         FROM (SELECT q.speaker, q.text, q.at, q.id
                 FROM memory_messages q
                WHERE q.user_id = m.user_id AND q.session_id = m.session_id
                  AND (q.at, q.id) <= (m.at, m.id)
                ORDER BY q.at DESC, q.id DESC
                LIMIT 5) AS p) AS s
 WHERE (m.span_embedding IS NULL OR ($5 AND m.span_embed_model IS DISTINCT FROM $4)) AND ($1::text IS NULL OR m.user_id = $1) AND m.id > $2
 ORDER BY m.id
 LIMIT $3
