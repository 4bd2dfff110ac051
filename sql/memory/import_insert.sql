-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- One import chunk (inside the chunk's transaction): new messages only; a message id
-- already stored for the user is left as it is (idempotent import).
INSERT INTO memory_messages (user_id, character_id, guild_id, channel_id, session_id, message_id,
                             speaker, text, at, context, embedding, embed_model, source)
SELECT u, c, g, ch, s, mid, sp, t, a, ctx, e, $12, 'import'
  FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[],
              $7::text[], $8::text[], $9::timestamptz[], $10::text[], $11::vector[])
       AS x(u, c, g, ch, s, mid, sp, t, a, ctx, e)
ON CONFLICT (user_id, message_id) DO NOTHING
RETURNING id
