-- The newest message time of one user, the reference for relative time phrases when no
-- --as-of is given (autocommit read).
SELECT max(at) FROM memory_messages
 WHERE user_id = $1 AND guild_id IS NOT DISTINCT FROM $2
   AND ($3::timestamptz IS NULL OR at <= $3)
