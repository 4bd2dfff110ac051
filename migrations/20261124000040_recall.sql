-- Issue 15: what the memory layers put into each turn, on the turn's log row (the kv_only
-- line carries M, memories_injected, context_injected and context_version after seed 000's
-- fields).
ALTER TABLE turn_log
    ADD COLUMN m_tokens          integer NOT NULL DEFAULT 0,
    ADD COLUMN memories_injected integer NOT NULL DEFAULT 0,
    -- The recall items injected: m<memory id>, x<dialogue hash>, c<card hash>.
    ADD COLUMN memory_keys       text[]  NOT NULL DEFAULT '{}',
    -- Candidates left out because the KV already held them.
    ADD COLUMN recall_in_kv      integer NOT NULL DEFAULT 0,
    ADD COLUMN recall_ms         integer NOT NULL DEFAULT 0,
    ADD COLUMN context_injected  boolean NOT NULL DEFAULT false,
    ADD COLUMN c_tokens          integer NOT NULL DEFAULT 0,
    ADD COLUMN context_version   text    NOT NULL DEFAULT '';
