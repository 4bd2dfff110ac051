-- The user's memory blob (autocommit read).
SELECT blob FROM memory_blobs WHERE user_id = $1 AND guild_id = coalesce($2, '')
