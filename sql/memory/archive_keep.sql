-- Soft-archives all but the newest $2 current, active, unpinned facts of one user
-- (subject 'user') and all but the newest $3 of each lore subject. One statement; no
-- transaction needed. Pinned facts are never archived.
WITH ranked AS (
    SELECT id, subject,
           row_number() OVER (PARTITION BY subject ORDER BY valid_from DESC, id DESC) AS rn
      FROM memories
     WHERE user_id = $1 AND status = 'ACTIVE' AND valid_to IS NULL AND NOT pinned
)
UPDATE memories m SET status = 'ARCHIVED', updated_at = now()
  FROM ranked r
 WHERE m.id = r.id
   AND ((r.subject = 'user' AND r.rn > $2) OR (r.subject <> 'user' AND r.rn > $3))
RETURNING m.id
