-- Every vector names the model that made it by the first 16 hex digits of the embedder
-- GGUF's sha256 (it was the file's name, which two different files can share), and a
-- message's span vector gets a column of its own: the two vectors of a row can come from
-- different models while a switch is under way. A search compares its query only with
-- vectors of its own model; the others are searched lexically until `kvmem memory
-- reindex` embeds them again.
ALTER TABLE memory_messages ADD COLUMN span_embed_model text;

-- The two files ops/fetch-embedder has written so far, by name, become their ids (their
-- sha256s are pinned there); any other name stays, and counts as another model.
CREATE FUNCTION kvmem_embed_model_id(name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE name
               WHEN 'all-MiniLM-L6-v2.q8_0.gguf' THEN 'a965e08ad95b3c01'
               WHEN 'all-MiniLM-L6-v2.f16.gguf' THEN '2b695768f7b164ba'
               ELSE name
           END
$$;
UPDATE memory_messages
   SET embed_model = kvmem_embed_model_id(embed_model),
       span_embed_model = CASE WHEN span_embedding IS NULL THEN NULL
                               ELSE kvmem_embed_model_id(embed_model) END
 WHERE embed_model IS NOT NULL OR span_embedding IS NOT NULL;
UPDATE memories SET embed_model = kvmem_embed_model_id(embed_model) WHERE embed_model IS NOT NULL;
DROP FUNCTION kvmem_embed_model_id(text);
