-- The user's current explicit facts, oldest first, for the blob (autocommit read).
SELECT text FROM memories
 WHERE user_id = $1 AND guild_id IS NOT DISTINCT FROM $2
   AND source = 'explicit' AND status = 'ACTIVE' AND valid_to IS NULL
 ORDER BY valid_from, id
