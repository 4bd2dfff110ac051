-- Stores the user's memory blob (autocommit, one statement).
INSERT INTO memory_blobs (user_id, guild_id, blob) VALUES ($1, coalesce($2, ''), $3)
ON CONFLICT (user_id, guild_id) DO UPDATE SET blob = EXCLUDED.blob, updated_at = now()
