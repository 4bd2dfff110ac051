-- Seed 001's entity-card expansion (autocommit read): for the given refs, the current
-- facts with importance >= 2 or pinned, best 3 per ref by pinned, importance, created.
WITH f AS (
    SELECT r.ref, m.id, m.text, m.pinned, m.importance, m.created_at,
           row_number() OVER (PARTITION BY r.ref
                              ORDER BY m.pinned DESC, m.importance DESC, m.created_at DESC, m.id DESC) AS rn
      FROM memories m
     CROSS JOIN LATERAL unnest(m.entity_refs) AS r(ref)
     WHERE m.user_id = $1
       AND ($2::bigint IS NULL OR m.character_id = $2 OR m.character_id IS NULL)
       AND m.guild_id IS NOT DISTINCT FROM $3
       AND m.status = 'ACTIVE' AND m.valid_to IS NULL
       AND (m.importance >= 2 OR m.pinned)
       AND ($4::text[] IS NULL OR r.ref = ANY($4::text[]))
)
SELECT ref, id, text, pinned, importance, created_at FROM f WHERE rn <= 3
 ORDER BY ref, rn
