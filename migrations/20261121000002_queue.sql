-- The turn queue: jobs, per-session leases, the per-attempt log and the dialogue.

CREATE TYPE turn_state AS ENUM ('queued', 'running', 'done', 'failed', 'dead');

-- Tunables the SQL API reads; ops may UPDATE them at run time.
CREATE TABLE kvmem_config (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO kvmem_config (key, value) VALUES
    ('max_message_chars', '8000'),
    ('max_attempts', '5');

CREATE TABLE turns (
    id              bigserial PRIMARY KEY,
    session_id      text        NOT NULL,
    user_id         text        NOT NULL,
    character_id    bigint      NOT NULL REFERENCES user_characters(id),
    message         text        NOT NULL,
    -- 'live' turns come from the backend; 'replay' turns from `kvmem replay`.
    lane            text        NOT NULL DEFAULT 'live' CHECK (lane IN ('live', 'replay')),
    state           turn_state  NOT NULL DEFAULT 'queued',
    attempts        integer     NOT NULL DEFAULT 0,
    max_attempts    integer     NOT NULL DEFAULT 5,
    run_at          timestamptz NOT NULL DEFAULT now(),
    reply           text,
    error           text,
    worker_id       text,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz
);
-- The database itself guarantees one running turn per session.
CREATE UNIQUE INDEX turns_one_running_per_session ON turns (session_id) WHERE state = 'running';
-- Claim scans pending turns in order; the index holds only the live part of the table.
CREATE INDEX turns_pending_idx ON turns (id) WHERE state IN ('queued', 'running');
CREATE INDEX turns_session_pending_idx ON turns (session_id, id) WHERE state IN ('queued', 'running');
CREATE INDEX turns_session_idx ON turns (session_id, id);
CREATE UNIQUE INDEX turns_idempotency_key ON turns (idempotency_key) WHERE idempotency_key IS NOT NULL;

-- One small row per session: the session's place in the queue and its lease.
-- head_* name the session's next turn (the oldest queued one), so a claim is an index
-- walk over ready sessions instead of a scan of every queued turn. Heartbeats update this
-- row instead of the wide turn row. fencing_token only ever grows, so a worker holding an
-- old token can be told apart.
CREATE TABLE session_locks (
    session_id    text        PRIMARY KEY,
    turn_id       bigint,
    owner         text,
    fencing_token bigint      NOT NULL DEFAULT 0,
    acquired_at   timestamptz,
    heartbeat_at  timestamptz,
    expires_at    timestamptz NOT NULL DEFAULT now(),
    head_turn_id  bigint,
    head_run_at   timestamptz,
    head_lane     text
);
CREATE INDEX session_locks_held_idx ON session_locks (expires_at) WHERE turn_id IS NOT NULL;
-- Sessions with a head turn and no lease: what a claim looks at.
CREATE INDEX session_locks_ready_idx ON session_locks (head_turn_id)
    WHERE head_turn_id IS NOT NULL AND turn_id IS NULL;

-- One row per attempt, with every field of seed 000's one-line log.
CREATE TABLE turn_log (
    id              bigserial PRIMARY KEY,
    turn_id         bigint      NOT NULL REFERENCES turns(id),
    attempt         integer     NOT NULL,
    worker_id       text        NOT NULL,
    path            text        NOT NULL,
    sid             text        NOT NULL,
    loaded          boolean     NOT NULL DEFAULT false,
    cold            boolean     NOT NULL DEFAULT true,
    cold_reason     text,
    tokens_loaded   integer     NOT NULL DEFAULT 0,
    tokens_in_kv    integer     NOT NULL DEFAULT 0,
    kv_bytes        bigint      NOT NULL DEFAULT 0,
    n_ctx           integer     NOT NULL DEFAULT 0,
    digest_injected boolean     NOT NULL DEFAULT false,
    digest_version  text        NOT NULL DEFAULT '',
    s_tokens        integer     NOT NULL DEFAULT 0,
    u_tokens        integer     NOT NULL DEFAULT 0,
    r_tokens        integer     NOT NULL DEFAULT 0,
    bpt             integer     NOT NULL DEFAULT 0,
    status          text        NOT NULL,
    error           text,
    latency_ms      integer     NOT NULL DEFAULT 0,
    load_ms         integer     NOT NULL DEFAULT 0,
    prefill_ms      integer     NOT NULL DEFAULT 0,
    ttft_ms         integer     NOT NULL DEFAULT 0,
    generate_ms     integer     NOT NULL DEFAULT 0,
    save_ms         integer     NOT NULL DEFAULT 0,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX turn_log_turn_idx ON turn_log (turn_id);
CREATE INDEX turn_log_finished_idx ON turn_log (finished_at);

-- The dialogue. One user and one assistant row per done turn, never more.
CREATE TABLE messages (
    id         bigserial PRIMARY KEY,
    session_id text        NOT NULL,
    turn_id    bigint      NOT NULL REFERENCES turns(id),
    role       text        NOT NULL CHECK (role IN ('user', 'assistant')),
    content    text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (turn_id, role)
);
CREATE INDEX messages_session_idx ON messages (session_id, turn_id);
