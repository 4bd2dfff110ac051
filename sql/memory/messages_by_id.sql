-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- The rows of the chosen candidates (autocommit read; the user filter keeps the wall even
-- if an id leaked across users), each with its cosine to the query $3 when one is given
-- and their vector is of the query's model $4 (the same expression as message_cosines.sql).
-- A row without one is scored by the lexical legs; the memory lane fills it (a search
-- only reads).
SELECT id, session_id, message_id, speaker, text, at, channel_id,
       CASE WHEN embed_model = $4 THEN (1 - (embedding <=> $3::vector))::float8 END AS cosine
  FROM memory_messages
 WHERE user_id = $1 AND id = ANY($2::bigint[])
