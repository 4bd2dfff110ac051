-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- The message an ingest job is about (autocommit read).
SELECT id, user_id, character_id, guild_id, channel_id, session_id, message_id, speaker, text,
       context, at,
       embedding IS NULL AS unembedded
  FROM memory_messages WHERE id = $1
