-- kvmem: message vectors (worker/memory/columns.rs names the columns of the embedder's width)
-- Which of a chunk's (user, message id) pairs are already stored, and whether they still
-- lack a vector (autocommit read; makes re-imports idempotent and lets them backfill; a
-- vector of another model waits for `kvmem memory reindex`).
SELECT m.id, m.user_id, m.message_id, m.embedding IS NULL AS unembedded, m.speaker, m.text, m.context
  FROM unnest($1::text[], $2::text[]) AS k(user_id, message_id)
  JOIN memory_messages m ON m.user_id = k.user_id AND m.message_id = k.message_id
