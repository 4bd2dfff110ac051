-- Long-term memory (issue 13): typed facts with history, the searchable dialogue corpus,
-- entity aliases and the memory job lane.

CREATE EXTENSION IF NOT EXISTS pg_trgm;

INSERT INTO kvmem_config (key, value) VALUES
    ('memory_backlog_max', '400'),
    ('memory_keep_user', '80'),
    ('memory_keep_lore', '120')
ON CONFLICT (key) DO NOTHING;

-- Seed 001's Memory B row plus seed 002's fields. One row per version of a fact: a write
-- under an existing key with another text closes the old row's validity (valid_to) and
-- becomes the current row, so history is kept and never overwritten.
CREATE TABLE memories (
    id                 bigserial PRIMARY KEY,
    user_id            text        NOT NULL,
    -- NULL = every character of the user sees it (seed 001's global write).
    character_id       bigint,
    -- Seed 002's hard scope; NULL is its own scope, not a wildcard.
    guild_id           text,
    -- A ranking hint only.
    channel_id         text,
    -- 'user' for facts about the user; a lore subject otherwise (keep-120 per subject).
    subject            text        NOT NULL DEFAULT 'user',
    kind               text        NOT NULL CHECK (kind IN ('PROFILE', 'PEOPLE', 'PROJECT')),
    fact_type          text        NOT NULL DEFAULT 'other'
                       CHECK (fact_type IN ('preference', 'profile', 'relationship', 'project', 'other', 'lore')),
    text               text        NOT NULL CHECK (length(btrim(text)) > 0),
    entity_refs        text[]      NOT NULL DEFAULT '{}',
    entity_label       text,
    subtype            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    importance         smallint    NOT NULL DEFAULT 1 CHECK (importance BETWEEN 0 AND 3),
    pinned             boolean     NOT NULL DEFAULT false,
    memory_key         text        NOT NULL,
    source             text        NOT NULL
                       CHECK (source IN ('extraction', 'explicit', 'seeded_profile', 'curated_fold', 'import', 'lore')),
    status             text        NOT NULL DEFAULT 'ACTIVE' CHECK (status IN ('ACTIVE', 'ARCHIVED')),
    confidence         real        NOT NULL DEFAULT 0.7 CHECK (confidence BETWEEN 0 AND 1),
    evidence_text      text,
    source_message_ids text[]      NOT NULL DEFAULT '{}',
    valid_from         timestamptz NOT NULL DEFAULT now(),
    -- NULL = the current version of its key.
    valid_to           timestamptz,
    embedding          bytea,
    embed_model        text,
    tsv                tsvector GENERATED ALWAYS AS (
                           setweight(to_tsvector('english', coalesce(entity_label, '') || ' ' || text), 'A')
                           || setweight(to_tsvector('english', coalesce(evidence_text, '')), 'C')) STORED,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CHECK (NOT pinned OR importance = 3),
    CHECK (valid_to IS NULL OR valid_to >= valid_from)
);
-- The database guarantees one current version per key and scope.
CREATE UNIQUE INDEX memories_current_key ON memories
    (user_id, coalesce(guild_id, ''), coalesce(character_id, 0), memory_key) WHERE valid_to IS NULL;
CREATE INDEX memories_key_history ON memories
    (user_id, coalesce(guild_id, ''), coalesce(character_id, 0), memory_key, valid_from);
CREATE INDEX memories_user_idx ON memories (user_id, status, valid_from);
CREATE INDEX memories_tsv_idx ON memories USING gin (tsv);
CREATE INDEX memories_refs_idx ON memories USING gin (entity_refs);

-- A pinned memory is importance 3 whatever the writer said (seed 001).
CREATE FUNCTION kvmem_memories_pin() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.pinned THEN
        NEW.importance := 3;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER memories_pin BEFORE INSERT OR UPDATE ON memories
FOR EACH ROW EXECUTE FUNCTION kvmem_memories_pin();

-- Both spellings of a merged entity resolve to the canonical ref, per user.
CREATE TABLE memory_entity_aliases (
    user_id       text        NOT NULL,
    alias_ref     text        NOT NULL,
    canonical_ref text        NOT NULL,
    similarity    real,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, alias_ref),
    CHECK (alias_ref <> canonical_ref)
);

-- The dialogue corpus: imported history and live turns' messages, searchable lexically
-- and by vector. `message_id` is the caller's own id, unique per user.
CREATE TABLE memory_messages (
    id           bigserial PRIMARY KEY,
    user_id      text        NOT NULL,
    character_id bigint,
    guild_id     text,
    channel_id   text,
    session_id   text        NOT NULL,
    message_id   text        NOT NULL,
    speaker      text        NOT NULL,
    text         text        NOT NULL,
    at           timestamptz NOT NULL,
    -- The previous message of the session, indexed with low weight (contextual key).
    context      text,
    source       text        NOT NULL DEFAULT 'import' CHECK (source IN ('import', 'turn')),
    embedding    bytea,
    embed_model  text,
    tsv          tsvector GENERATED ALWAYS AS (
                     setweight(to_tsvector('english', speaker || ' ' || text), 'A')
                     || setweight(to_tsvector('english', coalesce(context, '')), 'D')) STORED,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (user_id, message_id)
);
CREATE INDEX memory_messages_user_at_idx ON memory_messages (user_id, at);
CREATE INDEX memory_messages_session_idx ON memory_messages (user_id, session_id, at);
CREATE INDEX memory_messages_tsv_idx ON memory_messages USING gin (tsv);
CREATE INDEX memory_messages_unembedded_idx ON memory_messages (user_id, id) WHERE embedding IS NULL;

-- The memory lane: ingest, remember and forget jobs, ordered per user.
CREATE TABLE memory_jobs (
    id                bigserial PRIMARY KEY,
    user_id           text        NOT NULL,
    character_id      bigint,
    guild_id          text,
    kind              text        NOT NULL CHECK (kind IN ('ingest', 'remember', 'forget')),
    memory_message_id bigint      REFERENCES memory_messages(id) ON DELETE CASCADE,
    payload           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    state             text        NOT NULL DEFAULT 'queued'
                      CHECK (state IN ('queued', 'running', 'done', 'failed', 'dropped')),
    attempts          integer     NOT NULL DEFAULT 0,
    result            jsonb,
    error             text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz
);
-- Same-message dedup (seed 002): one ingest job per message, ever.
CREATE UNIQUE INDEX memory_jobs_ingest_once ON memory_jobs (memory_message_id) WHERE kind = 'ingest';
-- Per-user order: at most one running job per user, enforced by the database.
CREATE UNIQUE INDEX memory_jobs_one_running ON memory_jobs (user_id) WHERE state = 'running';
CREATE INDEX memory_jobs_queued_idx ON memory_jobs (user_id, id) WHERE state = 'queued';
CREATE INDEX memory_jobs_queued_all_idx ON memory_jobs (id) WHERE state = 'queued';

-- Overflow drops are counted, never silent.
CREATE TABLE memory_job_drops (
    user_id text   PRIMARY KEY,
    dropped bigint NOT NULL DEFAULT 0
);

-- Queues an ingest job and enforces the bounded backlog (drop oldest, count drops).
CREATE FUNCTION kvmem_memory_queue_ingest(p_message bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    m memory_messages%ROWTYPE;
    job bigint;
    cap integer;
    over integer;
BEGIN
    SELECT * INTO m FROM memory_messages WHERE id = p_message;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO memory_jobs (user_id, character_id, guild_id, kind, memory_message_id)
    VALUES (m.user_id, m.character_id, m.guild_id, 'ingest', m.id)
    ON CONFLICT (memory_message_id) WHERE kind = 'ingest' DO NOTHING
    RETURNING id INTO job;
    SELECT value::integer INTO cap FROM kvmem_config WHERE key = 'memory_backlog_max';
    cap := coalesce(cap, 400);
    WITH old AS (
        SELECT id FROM memory_jobs
        WHERE user_id = m.user_id AND state = 'queued' AND kind = 'ingest'
        ORDER BY id DESC OFFSET cap
        FOR UPDATE SKIP LOCKED
    )
    UPDATE memory_jobs j SET state = 'dropped', finished_at = now(), error = 'backlog overflow'
    FROM old WHERE j.id = old.id;
    GET DIAGNOSTICS over = ROW_COUNT;
    IF over > 0 THEN
        INSERT INTO memory_job_drops (user_id, dropped) VALUES (m.user_id, over)
        ON CONFLICT (user_id) DO UPDATE SET dropped = memory_job_drops.dropped + EXCLUDED.dropped;
    END IF;
    RETURN job;
END;
$$;

-- Live turns feed the corpus and the memory lane inside the completion transaction, so
-- the turn path needs no Rust change and a rolled-back turn leaves nothing behind.
CREATE FUNCTION kvmem_messages_to_memory() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    t turns%ROWTYPE;
    mid bigint;
BEGIN
    SELECT * INTO t FROM turns WHERE id = NEW.turn_id;
    INSERT INTO memory_messages (user_id, character_id, session_id, message_id, speaker, text, at, source)
    VALUES (t.user_id, t.character_id, NEW.session_id, 'turn:' || NEW.turn_id || ':' || NEW.role,
            NEW.role, NEW.content, NEW.created_at, 'turn')
    ON CONFLICT (user_id, message_id) DO NOTHING
    RETURNING id INTO mid;
    IF mid IS NOT NULL THEN
        PERFORM kvmem_memory_queue_ingest(mid);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER messages_to_memory AFTER INSERT ON messages
FOR EACH ROW EXECUTE FUNCTION kvmem_messages_to_memory();

-- Seed 004's per-user memory blob: the explicit facts merged into third-person prose,
-- rewritten by each remember/forget.
CREATE TABLE memory_blobs (
    user_id    text        NOT NULL,
    guild_id   text        NOT NULL DEFAULT '',
    blob       text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, guild_id)
);
