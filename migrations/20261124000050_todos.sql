-- Issue 19: seed 001's todos (persona-scoped open loops), and two more kinds of memory
-- job: a character's own memory line (seed 002's memoryLine) and seed 004's "remember
-- this about X" summarised from the recent conversation.
ALTER TABLE memory_jobs DROP CONSTRAINT memory_jobs_kind_check;
ALTER TABLE memory_jobs ADD CONSTRAINT memory_jobs_kind_check
    CHECK (kind IN ('ingest', 'remember', 'forget', 'line', 'remember_about'));

-- Seed 001's Todo table. Unlike memories (written globally, read per character), a todo
-- belongs to the character it was made to: "I'll go for a walk tomorrow" is a promise to
-- one character, so character_id is required and every read filters on it.
CREATE TABLE todos (
    id                 bigserial PRIMARY KEY,
    user_id            text        NOT NULL,
    character_id       bigint      NOT NULL,
    kind               text        NOT NULL
                       CHECK (kind IN ('commitment', 'habit', 'thread', 'friction')),
    -- The user's own words (a clause of the source message), so it is grounded by
    -- construction and never paraphrased.
    text               text        NOT NULL CHECK (length(btrim(text)) > 0),
    -- Normalised text: the same todo said twice while open is one row.
    todo_key           text        NOT NULL,
    status             text        NOT NULL DEFAULT 'open'
                       CHECK (status IN ('open', 'done', 'dropped')),
    -- Only when the text names one ("tomorrow", "on Friday", "2026-12-01").
    due_date           date,
    source_message_ids text[]      NOT NULL DEFAULT '{}',
    -- Provenance of a close: the message that completed or cancelled it, and its words.
    closed_by_message_id text,
    closed_evidence    text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    closed_at          timestamptz,
    CHECK ((status = 'open') = (closed_at IS NULL))
);
CREATE UNIQUE INDEX todos_open_key ON todos (user_id, character_id, todo_key) WHERE status = 'open';
CREATE INDEX todos_owner_idx ON todos (user_id, character_id, status, created_at);
