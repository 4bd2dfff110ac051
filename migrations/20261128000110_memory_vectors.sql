-- Message vectors move into pgvector, so a search reads its nearest neighbours from an
-- index instead of every vector the user has. The `bytea` column (little-endian f32) is
-- converted in place; a vector of another size than MiniLM's 384 is dropped and the
-- message counts as unembedded (the lane and the search backfill embed it again).
-- The conversion holds the table's lock until it commits: plan it for a quiet moment on a
-- large table. Without the extension this fails; `kvmem migrate` says how to install it.
CREATE EXTENSION IF NOT EXISTS vector;

-- Little-endian IEEE-754 single floats to a vector, exactly (float8 arithmetic holds every
-- normal float4 value); zero or subnormal exponents read as 0, a wrong length as NULL.
CREATE FUNCTION kvmem_f32le_vector(b bytea) RETURNS vector
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE WHEN length(b) <> 1536 THEN NULL ELSE (
        SELECT array_agg(CASE WHEN e = 0 THEN 0::float4
                              ELSE ((1 - 2 * s) * (1 + m / 8388608.0::float8) * power(2::float8, e - 127))::float4
                         END ORDER BY i)::vector
          FROM (SELECT i,
                       get_byte(b, i * 4 + 3) >> 7 AS s,
                       ((get_byte(b, i * 4 + 3) & 127) << 1) | (get_byte(b, i * 4 + 2) >> 7) AS e,
                       (((get_byte(b, i * 4 + 2) & 127) << 16) | (get_byte(b, i * 4 + 1) << 8)
                        | get_byte(b, i * 4))::float8 AS m
                  FROM generate_series(0, 383) AS i) AS f)
    END
$$;

ALTER TABLE memory_messages ADD COLUMN embedding_v vector(384);
UPDATE memory_messages SET embedding_v = kvmem_f32le_vector(embedding) WHERE embedding IS NOT NULL;
UPDATE memory_messages SET embed_model = NULL WHERE embedding_v IS NULL;
DROP INDEX memory_messages_unembedded_idx;
ALTER TABLE memory_messages DROP COLUMN embedding;
ALTER TABLE memory_messages RENAME COLUMN embedding_v TO embedding;
CREATE INDEX memory_messages_unembedded_idx ON memory_messages (user_id, id) WHERE embedding IS NULL;
