-- Near-identical entity slugs of one user, by pg_trgm similarity of the slug part within
-- one entity type, not yet merged (autocommit read).
WITH refs AS (
    SELECT r AS ref, count(*) AS n
      FROM memories, unnest(entity_refs) AS r
     WHERE user_id = $1 AND status = 'ACTIVE' AND valid_to IS NULL
     GROUP BY r
)
SELECT a.ref AS a_ref, a.n AS a_n, b.ref AS b_ref, b.n AS b_n,
       similarity(split_part(a.ref, ':', 2), split_part(b.ref, ':', 2)) AS sim
  FROM refs a
  JOIN refs b ON a.ref < b.ref AND split_part(a.ref, ':', 1) = split_part(b.ref, ':', 1)
 WHERE similarity(split_part(a.ref, ':', 2), split_part(b.ref, ':', 2)) >= $2
   AND NOT EXISTS (SELECT 1 FROM memory_entity_aliases x
                    WHERE x.user_id = $1 AND x.alias_ref IN (a.ref, b.ref))
 ORDER BY sim DESC, a.ref, b.ref
