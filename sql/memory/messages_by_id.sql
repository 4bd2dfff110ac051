-- The rows of the chosen candidates (autocommit read; the user filter keeps the wall even
-- if an id leaked across users).
SELECT id, session_id, message_id, speaker, text, at, context, channel_id,
       embedding IS NULL AS unembedded
  FROM memory_messages
 WHERE user_id = $1 AND id = ANY($2::bigint[])
