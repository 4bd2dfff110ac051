-- The rows of the chosen candidates (autocommit read; the user filter keeps the wall even
-- if an id leaked across users), each with its cosine to the query $3 when one is given
-- (the same expression as message_cosines.sql).
SELECT id, session_id, message_id, speaker, text, at, context, channel_id,
       embedding IS NULL AS unembedded,
       (1 - (embedding <=> $3::vector))::float8 AS cosine
  FROM memory_messages
 WHERE user_id = $1 AND id = ANY($2::bigint[])
