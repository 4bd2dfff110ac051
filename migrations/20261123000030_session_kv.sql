-- The dialogue as the session's KV holds it after its last committed turn: token ids and
-- the LLKV1 segment table. Written in the completion transaction, so it always describes
-- the committed turn. A cold start decodes these tokens instead of re-tokenizing the text,
-- which makes a snapshot a cache: losing one does not change what the character says.
CREATE TABLE session_kv (
    session_id     text        PRIMARY KEY,
    user_id        text        NOT NULL,
    character_id   bigint      NOT NULL,
    turn_id        bigint      NOT NULL,
    -- Token ids are only meaningful to the model (tokenizer) that made them.
    model_sha      text        NOT NULL,
    token_ids      int4[]      NOT NULL,
    -- `B:57,T:120,D:40,...`, tiling token_ids exactly.
    segments       text        NOT NULL,
    digest_version text        NOT NULL DEFAULT '',
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- How a cold start laid the dialogue back: 'exact' from session_kv, 'text' from messages.
ALTER TABLE turn_log ADD COLUMN rebuild text CHECK (rebuild IN ('exact', 'text'));

-- Time spent decoding the exchange again without the HUD, and the tail after a prune: the
-- price of a KV that a cold start can reproduce.
ALTER TABLE turn_log ADD COLUMN redecode_ms integer NOT NULL DEFAULT 0;
