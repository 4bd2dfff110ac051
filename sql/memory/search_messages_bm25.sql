-- BM25 over one user's messages (autocommit read): the query's lexemes (Postgres' English
-- parser, as the index has them), their inverse document frequencies from the user's own
-- lexicon, then the messages to score, by Okapi BM25 (k1 = $6, b = $7) over every query
-- lexeme. A lexeme in the reply-to context (weight D) counts $8 of an own-word occurrence.
-- $2 character filter (seed 001), $3 guild (hard), $4 as-of cut, $9 the number of results.
-- Which messages are scored: for a user with at most $10 messages, every one holding a
-- query lexeme; for a larger user, those holding its rarest lexemes while their matches
-- add up to at most $10 (a lexeme in thousands of messages weighs little and would make
-- the search read them all), and the vector leg's candidates $11. The guild test is
-- spelled out for the planner's estimate (see search_messages_vectors).
WITH stats AS (
    SELECT docs::float8 AS n, positions::float8 / greatest(docs, 1) AS avgdl
      FROM memory_lexicon_users WHERE user_id = $1
), idf AS (
    SELECT l.term, l.df, ln(1 + (s.n - l.df + 0.5) / (l.df + 0.5)) AS idf
      FROM stats s
      JOIN memory_lexicon l ON l.user_id = $1
     WHERE l.term IN (SELECT lexeme FROM unnest(to_tsvector('english', $5::text)))
), pull AS (
    SELECT x.term
      FROM (SELECT term, sum(df) OVER (ORDER BY df, term) AS spent FROM idf) x, stats s
     WHERE x.spent <= $10 OR s.n <= $10
), q AS (
    SELECT string_agg(quote_literal(term), ' | ')::tsquery AS q FROM pull
), cand_ids AS (
    SELECT m.id
      FROM memory_messages m, q
     WHERE m.user_id = $1 AND m.tsv @@ q.q
    UNION
    SELECT unnest($11::bigint[])
), cand AS (
    SELECT m.id, m.tsv, kvmem_own_positions(m.tsv) AS dl
      FROM memory_messages m
      JOIN cand_ids c ON c.id = m.id
     WHERE m.user_id = $1
       AND ($2::bigint IS NULL OR m.character_id = $2 OR m.character_id IS NULL)
       AND (m.guild_id = $3 OR (m.guild_id IS NULL AND $3::text IS NULL))
       AND ($4::timestamptz IS NULL OR m.at <= $4)
)
SELECT c.id,
       sum(i.idf * t.tf * ($6 + 1) / (t.tf + $6 * (1 - $7 + $7 * c.dl / s.avgdl)))::float8 AS score
  FROM cand c
  CROSS JOIN stats s
  CROSS JOIN LATERAL (
      SELECT u.lexeme,
             (SELECT sum(CASE WHEN w = 'D' THEN $8::float8 ELSE 1.0 END) FROM unnest(u.weights) w) AS tf
        FROM unnest(c.tsv) u) t
  JOIN idf i ON i.term = t.lexeme
 GROUP BY c.id
 ORDER BY score DESC, c.id
 LIMIT $9
