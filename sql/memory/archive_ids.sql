-- Soft-archives the given facts of one user (forget, curator fold); autocommit.
UPDATE memories SET status = 'ARCHIVED', updated_at = now()
 WHERE user_id = $1 AND id = ANY($2::bigint[]) AND status = 'ACTIVE'
RETURNING id
