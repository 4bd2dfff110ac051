-- BM25 over one user's messages (autocommit read), each message read with its neighbours:
-- the query's lexemes (Postgres' English parser, as the index has them), their inverse
-- document frequencies from the user's own lexicon, then the messages to score, by Okapi
-- BM25 (k1 = $6, b = $7) over every query lexeme. A lexeme in the reply-to context (weight
-- D) counts $8 of an own-word occurrence, and one in the own words of a turn up to $12
-- turns before or after the message in its session counts $13: the answer to a question,
-- and the reaction that names its topic, sit beside the turn. The neighbours are read at
-- search time, so a turn's key is complete as soon as its later turns are stored.
-- $2 character filter (seed 001), $3 guild (hard), $4 as-of cut (a neighbour after it
-- lends nothing), $9 the number of results.
-- Which messages are scored: for a user with at most $10 messages, every one holding a
-- query lexeme and their neighbours; for a larger user, those holding its rarest lexemes
-- while their matches add up to at most $10 (a lexeme in thousands of messages weighs
-- little and would make the search read them all) and their neighbours, and the vector
-- leg's candidates $11. The guild test is spelled out for the planner's estimate (see
-- search_messages_vectors).
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
), matched AS (
    SELECT m.id, m.session_id, m.at, m.tsv
      FROM memory_messages m, q
     WHERE m.user_id = $1 AND m.tsv @@ q.q
       AND ($2::bigint IS NULL OR m.character_id = $2 OR m.character_id IS NULL)
       AND (m.guild_id = $3 OR (m.guild_id IS NULL AND $3::text IS NULL))
       AND ($4::timestamptz IS NULL OR m.at <= $4)
), lent AS (
    -- What each match lends its neighbours: its own words' occurrences of pulled lexemes.
    SELECT h.id, u.lexeme AS term,
           (SELECT count(*) FROM unnest(u.weights) w WHERE w <> 'D')::float8 AS own
      FROM matched h, unnest(h.tsv) u
     WHERE u.lexeme IN (SELECT term FROM pull)
), near AS (
    SELECT h.id AS src, n.id
      FROM matched h
     CROSS JOIN LATERAL (
           (SELECT x.id FROM memory_messages x
             WHERE x.user_id = $1 AND x.session_id = h.session_id AND (x.at, x.id) < (h.at, h.id)
             ORDER BY x.at DESC, x.id DESC LIMIT $12)
           UNION ALL
           (SELECT x.id FROM memory_messages x
             WHERE x.user_id = $1 AND x.session_id = h.session_id AND (x.at, x.id) > (h.at, h.id)
               AND ($4::timestamptz IS NULL OR x.at <= $4)
             ORDER BY x.at, x.id LIMIT $12)) AS n
     WHERE $13::float8 > 0
), cand AS (
    SELECT m.id, m.tsv, kvmem_own_positions(m.tsv) AS dl
      FROM memory_messages m
      JOIN (SELECT id FROM matched UNION SELECT id FROM near UNION SELECT unnest($11::bigint[])) c
        ON c.id = m.id
     WHERE m.user_id = $1
       AND ($2::bigint IS NULL OR m.character_id = $2 OR m.character_id IS NULL)
       AND (m.guild_id = $3 OR (m.guild_id IS NULL AND $3::text IS NULL))
       AND ($4::timestamptz IS NULL OR m.at <= $4)
), tf AS (
    SELECT id, term, sum(tf) AS tf
      FROM (SELECT c.id, u.lexeme AS term,
                   (SELECT sum(CASE WHEN w = 'D' THEN $8::float8 ELSE 1.0 END) FROM unnest(u.weights) w) AS tf
              FROM cand c, unnest(c.tsv) u
            UNION ALL
            SELECT n.id, l.term, $13::float8 * l.own
              FROM near n JOIN lent l ON l.id = n.src
             WHERE l.own > 0) x
     GROUP BY id, term
)
SELECT c.id,
       sum(i.idf * t.tf * ($6 + 1) / (t.tf + $6 * (1 - $7 + $7 * c.dl / s.avgdl)))::float8 AS score
  FROM cand c
  CROSS JOIN stats s
  JOIN tf t ON t.id = c.id
  JOIN idf i ON i.term = t.term
 GROUP BY c.id
 ORDER BY score DESC, c.id
 LIMIT $9
