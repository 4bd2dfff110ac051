-- The summary trigger's two hot upserts rewrote a summary_jobs row on every message, and a
-- rewrite there touches every index of the table (run_at and payload are indexed), which
-- `ops/queue-profile` put at a fifth of a completion's database time. Now the close job's
-- row is rewritten only when its due time moves (all messages of one completion share
-- theirs), and a queued spine job is left as queued: the job reads the totals when it runs.
-- Neither beat replaces a queued job's payload any more, so a `kvmem summary rebuild` queued
-- before the beat keeps its `rebuild` flag (the rolling beat merges its count into it).
-- Everything else is as in 20261123000020_summary.sql.

CREATE OR REPLACE FUNCTION kvmem_summary_on_message() RETURNS trigger
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
    DO UPDATE SET run_at = EXCLUDED.run_at
    WHERE summary_jobs.run_at IS DISTINCT FROM EXCLUDED.run_at;

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
        DO UPDATE SET payload = summary_jobs.payload || EXCLUDED.payload,
                      session_id = EXCLUDED.session_id;
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
    -- A queued spine job reads the totals when it runs; while one waits there is nothing
    -- to add (its payload keeps the total that queued it).
    IF EXISTS (SELECT 1 FROM summary_jobs
                WHERE user_id = t.user_id AND kind = 'spine' AND state = 'queued') THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(sum(message_count), 0) INTO total FROM session_state WHERE user_id = t.user_id;
    SELECT coalesce(max(message_total_at), 0) INTO spine_at FROM summary_spine WHERE user_id = t.user_id;
    IF total - spine_at >= every_spine THEN
        INSERT INTO summary_jobs (kind, user_id, payload, run_at)
        VALUES ('spine', t.user_id, jsonb_build_object('message_total', total), NEW.created_at)
        ON CONFLICT (user_id) WHERE kind = 'spine' AND state = 'queued' DO NOTHING;
    END IF;
    RETURN NULL;
END;
$$;
