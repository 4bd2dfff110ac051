-- Issue 14: the summary hierarchy. Seed 001's sessions, session state, rolling summaries,
-- session summaries and spine; seed 004's daily / historical summaries and merged user
-- context; seed 003's contexts. Summary work is queued in `summary_jobs`, a lane below
-- live turns, by a trigger on `messages` inside the turn's own completion transaction.

-- Tunables, read by the trigger (ops may UPDATE them at run time).
INSERT INTO kvmem_config (key, value) VALUES
    ('summary_session_idle_s', '1800'),
    ('summary_rolling_every', '4'),
    ('summary_spine_every', '20')
ON CONFLICT (key) DO NOTHING;

-- Seed 001's Session: per user + character, closed after 30 minutes of inactivity.
CREATE TABLE summary_sessions (
    id               bigserial PRIMARY KEY,
    user_id          text        NOT NULL,
    character_id     bigint      NOT NULL,
    started_at       timestamptz NOT NULL,
    last_activity_at timestamptz NOT NULL,
    ended_at         timestamptz,
    -- User messages in this session (seed 001's turnCount).
    turn_count       integer     NOT NULL DEFAULT 0,
    -- The session's span of `messages` rows (ids grow in commit order per user/character).
    first_message_id bigint      NOT NULL,
    last_message_id  bigint      NOT NULL
);
-- At most one open session per user and character, enforced by the database.
CREATE UNIQUE INDEX summary_sessions_one_open ON summary_sessions (user_id, character_id)
    WHERE ended_at IS NULL;
CREATE INDEX summary_sessions_user_idx ON summary_sessions (user_id, character_id, id);

-- Seed 001's SessionState: per user + character, survives sessions.
CREATE TABLE session_state (
    user_id                      text        NOT NULL,
    character_id                 bigint      NOT NULL,
    message_count                integer     NOT NULL DEFAULT 0,
    last_interaction             timestamptz,
    last_user_message            text,
    curator_last_run_at          timestamptz,
    curator_last_memory_count    integer,
    last_rolling_attempt_at      timestamptz,
    last_rolling_success_at      timestamptz,
    last_rolling_error           jsonb,
    -- The current rolling summary (at most 600 characters); its history is below.
    rolling_summary              text        NOT NULL DEFAULT '',
    -- The last message already folded into the rolling summary.
    rolling_last_message_id      bigint      NOT NULL DEFAULT 0,
    updated_at                   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, character_id),
    CHECK (char_length(rolling_summary) <= 600)
);

-- Every rolling summary ever made: seed 001 overwrote them and lost context; here each
-- version is kept, and the previous one is an input of the next.
CREATE TABLE rolling_summaries (
    id              bigserial PRIMARY KEY,
    user_id         text        NOT NULL,
    character_id    bigint      NOT NULL,
    session_id      bigint      REFERENCES summary_sessions(id),
    previous_id     bigint      REFERENCES rolling_summaries(id),
    message_count   integer     NOT NULL,
    last_message_id bigint      NOT NULL,
    content         text        NOT NULL CHECK (char_length(content) BETWEEN 1 AND 600),
    elapsed_ms      integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rolling_summaries_user_idx ON rolling_summaries (user_id, character_id, id);

-- Seed 001's SessionSummary. A summary that never validated is stored as an error with the
-- raw answers, never as a summary.
CREATE TABLE session_summaries (
    id           bigserial PRIMARY KEY,
    session_id   bigint      NOT NULL REFERENCES summary_sessions(id),
    user_id      text        NOT NULL,
    character_id bigint      NOT NULL,
    status       text        NOT NULL CHECK (status IN ('ok', 'error')),
    summary      jsonb,
    error        text,
    attempts     integer     NOT NULL,
    raw_answers  jsonb       NOT NULL DEFAULT '[]'::jsonb,
    elapsed_ms   integer     NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'ok') = (summary IS NOT NULL))
);
CREATE INDEX session_summaries_user_idx ON session_summaries (user_id, character_id, id);

-- Seed 001's SummarySpine: per user (all characters), a new row per version.
CREATE TABLE summary_spine (
    id               bigserial PRIMARY KEY,
    user_id          text        NOT NULL,
    version          integer     NOT NULL,
    content          text        NOT NULL,
    sections         jsonb       NOT NULL,
    -- User messages since the previous version, and the user's total when it was made.
    message_count    integer     NOT NULL,
    message_total_at integer     NOT NULL,
    elapsed_ms       integer     NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (user_id, version)
);

-- The summary lane: jobs ordered per user, due at `run_at`, below live turns.
CREATE TABLE summary_jobs (
    id           bigserial PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('close', 'rolling', 'session', 'spine', 'compact', 'context')),
    user_id      text        NOT NULL,
    character_id bigint,
    session_id   bigint      REFERENCES summary_sessions(id),
    payload      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    state        text        NOT NULL DEFAULT 'queued'
                 CHECK (state IN ('queued', 'running', 'done', 'failed')),
    attempts     integer     NOT NULL DEFAULT 0,
    run_at       timestamptz NOT NULL DEFAULT now(),
    result       jsonb,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    finished_at  timestamptz
);
CREATE UNIQUE INDEX summary_jobs_one_running ON summary_jobs (user_id) WHERE state = 'running';
CREATE INDEX summary_jobs_due_idx ON summary_jobs (run_at, id) WHERE state = 'queued';
-- Dedup: one pending close per session, one pending rolling per user/character, one
-- pending spine per user, one session summary per session while pending.
CREATE UNIQUE INDEX summary_jobs_close_once ON summary_jobs (session_id)
    WHERE kind = 'close' AND state = 'queued';
CREATE UNIQUE INDEX summary_jobs_session_once ON summary_jobs (session_id)
    WHERE kind = 'session' AND state = 'queued';
CREATE UNIQUE INDEX summary_jobs_rolling_once ON summary_jobs (user_id, character_id)
    WHERE kind = 'rolling' AND state = 'queued';
CREATE UNIQUE INDEX summary_jobs_spine_once ON summary_jobs (user_id)
    WHERE kind = 'spine' AND state = 'queued';
CREATE UNIQUE INDEX summary_jobs_compact_once ON summary_jobs ((payload->>'chat_session'))
    WHERE kind = 'compact' AND state = 'queued';
CREATE UNIQUE INDEX summary_jobs_context_once ON summary_jobs (user_id, (payload->>'scope'))
    WHERE kind = 'context' AND state = 'queued';

-- Seed 004's batch daily summaries, persisted so a restarted or another worker reuses them.
-- `bucket` is 'HH' for the current day (one row per hour bucket) and 'day' for a past day.
CREATE TABLE daily_summaries (
    scope      text        NOT NULL,
    day        date        NOT NULL,
    bucket     text        NOT NULL,
    summaries  jsonb       NOT NULL,
    elapsed_ms integer     NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, day, bucket)
);

-- Seed 004's historical summary of days 2-7, keyed by its end date (yesterday).
CREATE TABLE historical_summaries (
    scope      text        NOT NULL,
    user_id    text        NOT NULL,
    end_date   date        NOT NULL,
    summary    text        NOT NULL,
    elapsed_ms integer     NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, user_id, end_date)
);

-- Seed 004's merged user context, keyed by the content hashes of its three inputs.
CREATE TABLE user_contexts (
    scope           text        NOT NULL,
    user_id         text        NOT NULL,
    facts_hash      text        NOT NULL,
    current_hash    text        NOT NULL,
    historical_hash text        NOT NULL,
    context         text        NOT NULL,
    degraded        text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, user_id, facts_hash, current_hash, historical_hash)
);
CREATE INDEX user_contexts_latest_idx ON user_contexts (scope, user_id, created_at);

-- Seed 003's ContextManager store. `json` (not jsonb) keeps the document's text, key order
-- included, so an exported context is byte-for-byte what was saved.
CREATE TABLE contexts (
    session_id text        PRIMARY KEY,
    data       json        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Compaction of a chat session's history: `messages` stays the record; this moves the
-- boundary a cold start re-reads from, and keeps the summary of what lies before it.
CREATE TABLE session_compactions (
    session_id          text        PRIMARY KEY,
    boundary_message_id bigint      NOT NULL,
    long_term_summary   text        NOT NULL,
    compacted_entries   integer     NOT NULL,
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- Closes the open session `p_session` if it has been idle for `summary_session_idle_s` at
-- `p_now`; it ends at its idle deadline. Queues its session summary. Used by the close job
-- and by the next message when that job has not run yet. The idle check sits in the
-- UPDATE's WHERE, so a message committed meanwhile (the row re-read) keeps it open.
CREATE FUNCTION kvmem_summary_close(p_session bigint, p_now timestamptz, p_by text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    s summary_sessions%ROWTYPE;
    idle interval;
BEGIN
    idle := make_interval(secs => coalesce(
        (SELECT value::integer FROM kvmem_config WHERE key = 'summary_session_idle_s'), 1800));
    UPDATE summary_sessions SET ended_at = last_activity_at + idle
     WHERE id = p_session AND ended_at IS NULL AND last_activity_at + idle <= p_now
    RETURNING * INTO s;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE summary_jobs
       SET state = 'done', finished_at = now(), result = jsonb_build_object('closed_by', p_by)
     WHERE session_id = p_session AND kind = 'close' AND state = 'queued';
    INSERT INTO summary_jobs (kind, user_id, character_id, session_id, run_at)
    VALUES ('session', s.user_id, s.character_id, s.id, s.ended_at)
    ON CONFLICT (session_id) WHERE kind = 'session' AND state = 'queued' DO NOTHING;
    -- Seed 004's user context (today + days 2-7 + facts) now includes this session's day;
    -- made ahead, so the next session finds it stored. Turns are direct chats: scope ''.
    INSERT INTO summary_jobs (kind, user_id, character_id, session_id, payload, run_at)
    VALUES ('context', s.user_id, s.character_id, s.id, jsonb_build_object('scope', ''), s.ended_at)
    ON CONFLICT (user_id, (payload->>'scope')) WHERE kind = 'context' AND state = 'queued'
    DO NOTHING;
    INSERT INTO events (kind, detail)
    VALUES ('summary_session_closed', jsonb_build_object(
        'user_id', s.user_id, 'character_id', s.character_id, 'summary_session', s.id,
        'turn_count', s.turn_count, 'ended_at', s.ended_at, 'closed_by', p_by));
    RETURN true;
END;
$$;

-- Every live turn's message updates the session and session state in the completion
-- transaction and queues the summary jobs that are now due (seed 001's timeline).
CREATE FUNCTION kvmem_summary_on_message() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    t turns%ROWTYPE;
    s summary_sessions%ROWTYPE;
    st session_state%ROWTYPE;
    is_open boolean;
    idle interval;
    every_rolling integer;
    every_spine integer;
    total integer;
    spine_at integer;
BEGIN
    SELECT * INTO t FROM turns WHERE id = NEW.turn_id;
    IF NOT FOUND OR t.lane <> 'live' THEN
        RETURN NULL;
    END IF;
    idle := make_interval(secs => coalesce(
        (SELECT value::integer FROM kvmem_config WHERE key = 'summary_session_idle_s'), 1800));
    every_rolling := coalesce(
        (SELECT value::integer FROM kvmem_config WHERE key = 'summary_rolling_every'), 4);
    every_spine := coalesce(
        (SELECT value::integer FROM kvmem_config WHERE key = 'summary_spine_every'), 20);
    PERFORM pg_advisory_xact_lock(hashtext('kvmem:summary:' || t.user_id || ':' || t.character_id));

    SELECT * INTO s FROM summary_sessions
     WHERE user_id = t.user_id AND character_id = t.character_id AND ended_at IS NULL
       FOR UPDATE;
    is_open := FOUND;
    IF is_open AND kvmem_summary_close(s.id, NEW.created_at, 'next_message') THEN
        is_open := false;
    END IF;
    IF NOT is_open THEN
        INSERT INTO summary_sessions (user_id, character_id, started_at, last_activity_at,
                                      first_message_id, last_message_id)
        VALUES (t.user_id, t.character_id, NEW.created_at, NEW.created_at, NEW.id, NEW.id)
        RETURNING * INTO s;
        INSERT INTO events (kind, detail)
        VALUES ('summary_session_opened', jsonb_build_object(
            'user_id', t.user_id, 'character_id', t.character_id, 'summary_session', s.id));
    END IF;
    UPDATE summary_sessions
       SET last_activity_at = greatest(last_activity_at, NEW.created_at),
           last_message_id = greatest(last_message_id, NEW.id),
           turn_count = turn_count + (NEW.role = 'user')::integer
     WHERE id = s.id
    RETURNING * INTO s;
    -- The close is a job, due once the session has been idle for `idle`.
    INSERT INTO summary_jobs (kind, user_id, character_id, session_id, run_at)
    VALUES ('close', t.user_id, t.character_id, s.id, s.last_activity_at + idle)
    ON CONFLICT (session_id) WHERE kind = 'close' AND state = 'queued'
    DO UPDATE SET run_at = EXCLUDED.run_at;

    IF NEW.role <> 'user' THEN
        RETURN NULL;
    END IF;
    INSERT INTO session_state (user_id, character_id, message_count, last_interaction, last_user_message)
    VALUES (t.user_id, t.character_id, 1, NEW.created_at, left(NEW.content, 200))
    ON CONFLICT (user_id, character_id) DO UPDATE
       SET message_count = session_state.message_count + 1,
           last_interaction = EXCLUDED.last_interaction,
           last_user_message = EXCLUDED.last_user_message,
           updated_at = now()
    RETURNING * INTO st;
    IF st.message_count % every_rolling = 0 THEN
        INSERT INTO summary_jobs (kind, user_id, character_id, session_id, payload, run_at)
        VALUES ('rolling', t.user_id, t.character_id, s.id,
                jsonb_build_object('message_count', st.message_count), NEW.created_at)
        ON CONFLICT (user_id, character_id) WHERE kind = 'rolling' AND state = 'queued'
        DO UPDATE SET payload = EXCLUDED.payload, session_id = EXCLUDED.session_id;
        -- Seed 003: a history of more than 50 entries past the compaction boundary is
        -- compacted (counted on the same beat, not on every message).
        IF (SELECT count(*) FROM messages m
             WHERE m.session_id = NEW.session_id
               AND m.id > coalesce((SELECT boundary_message_id FROM session_compactions c
                                     WHERE c.session_id = NEW.session_id), 0)) > 50 THEN
            INSERT INTO summary_jobs (kind, user_id, character_id, payload, run_at)
            VALUES ('compact', t.user_id, t.character_id,
                    jsonb_build_object('chat_session', NEW.session_id), NEW.created_at)
            ON CONFLICT ((payload->>'chat_session')) WHERE kind = 'compact' AND state = 'queued'
            DO NOTHING;
        END IF;
    END IF;
    SELECT coalesce(sum(message_count), 0) INTO total FROM session_state WHERE user_id = t.user_id;
    SELECT coalesce(max(message_total_at), 0) INTO spine_at FROM summary_spine WHERE user_id = t.user_id;
    IF total - spine_at >= every_spine THEN
        INSERT INTO summary_jobs (kind, user_id, payload, run_at)
        VALUES ('spine', t.user_id, jsonb_build_object('message_total', total), NEW.created_at)
        ON CONFLICT (user_id) WHERE kind = 'spine' AND state = 'queued'
        DO UPDATE SET payload = EXCLUDED.payload;
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER messages_to_summary AFTER INSERT ON messages
FOR EACH ROW EXECUTE FUNCTION kvmem_summary_on_message();
