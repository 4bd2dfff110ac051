-- The rows of the chosen candidates (autocommit read; the user filter keeps the wall even
-- if an id leaked across users), each with its cosine to the query $3 when one is given
-- and their vector is of the query's model $4 (the same expression as message_cosines.sql).
-- `unembedded`: no vector at all (the search fills a few; another model's vector waits for
-- `kvmem memory reindex`).
SELECT id, session_id, message_id, speaker, text, at, context, channel_id,
       embedding IS NULL AS unembedded,
       CASE WHEN embed_model = $4 THEN (1 - (embedding <=> $3::vector))::float8 END AS cosine
  FROM memory_messages
 WHERE user_id = $1 AND id = ANY($2::bigint[])
