-- Full-text candidates among one user's messages: any query word matches (an OR query),
-- ranked by cover density (autocommit read). $2 character filter (seed 001), $3 guild
-- (hard), $4 as-of cut, $6/$7 optional time window.
SELECT m.id, ts_rank_cd(m.tsv, q, 1)::float8 AS rank
  FROM memory_messages m, to_tsquery('english', $5) AS q
 WHERE m.user_id = $1
   AND ($2::bigint IS NULL OR m.character_id = $2 OR m.character_id IS NULL)
   AND m.guild_id IS NOT DISTINCT FROM $3
   AND ($4::timestamptz IS NULL OR m.at <= $4)
   AND ($6::timestamptz IS NULL OR m.at >= $6)
   AND ($7::timestamptz IS NULL OR m.at < $7)
   AND m.tsv @@ q
 ORDER BY rank DESC, m.id
 LIMIT $8
