-- The memory SQL API for backends: queue remember/forget and get a handle (the job id).
--
--   SELECT kvmem_remember('user_1', 42, 'my sister Ana lives in Lisbon');
--   SELECT kvmem_forget('user_1', NULL, 'Ana lives in Lisbon');
--   SELECT state, result FROM memory_jobs WHERE id = <handle>;
--
-- The work runs on the memory lane (process_next_memory_job); the job row records the
-- outcome (`result->>'found'` for forget). Bad input raises SQLSTATE 22023 and queues nothing.
CREATE OR REPLACE FUNCTION kvmem_memory_check(p_user text, p_text text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_user IS NULL OR btrim(p_user) = '' THEN
        RAISE EXCEPTION 'user_id must not be empty' USING ERRCODE = '22023';
    END IF;
    IF p_text IS NULL OR length(btrim(p_text)) < 3 THEN
        RAISE EXCEPTION 'text must have at least 3 characters' USING ERRCODE = '22023';
    END IF;
    IF length(p_text) > 2000 THEN
        RAISE EXCEPTION 'text is longer than 2000 characters' USING ERRCODE = '22023';
    END IF;
END;
$$;

DROP FUNCTION IF EXISTS kvmem_remember(text, bigint, text, text, text[]);
CREATE OR REPLACE FUNCTION kvmem_remember(
    p_user text, p_character bigint, p_text text, p_guild text DEFAULT NULL,
    p_entity_refs text[] DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    job bigint;
BEGIN
    PERFORM kvmem_memory_check(p_user, p_text);
    INSERT INTO memory_jobs (user_id, character_id, guild_id, kind, payload)
    VALUES (p_user, p_character, p_guild, 'remember',
            jsonb_build_object('text', btrim(p_text), 'entity_refs', coalesce(p_entity_refs, '{}')))
    RETURNING id INTO job;
    PERFORM pg_notify('kvmem_memory', job::text);
    RETURN job;
END;
$$;

-- An in-chat "remember that …" (sql/queue/memory_ops.sql): the same job, citing the turn
-- that asked (`turn:<id>:user`), so the memory is its dialogue's and goes with its
-- session's or character's erase.
CREATE OR REPLACE FUNCTION kvmem_remember_from(
    p_user text, p_character bigint, p_text text, p_source text
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    job bigint;
BEGIN
    PERFORM kvmem_memory_check(p_user, p_text);
    INSERT INTO memory_jobs (user_id, character_id, kind, payload)
    VALUES (p_user, p_character, 'remember',
            jsonb_build_object('text', btrim(p_text), 'entity_refs', '{}'::text[],
                               'source', p_source))
    RETURNING id INTO job;
    PERFORM pg_notify('kvmem_memory', job::text);
    RETURN job;
END;
$$;

CREATE OR REPLACE FUNCTION kvmem_forget(
    p_user text, p_character bigint, p_text text, p_guild text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    job bigint;
BEGIN
    PERFORM kvmem_memory_check(p_user, p_text);
    INSERT INTO memory_jobs (user_id, character_id, guild_id, kind, payload)
    VALUES (p_user, p_character, p_guild, 'forget', jsonb_build_object('text', btrim(p_text)))
    RETURNING id INTO job;
    PERFORM pg_notify('kvmem_memory', job::text);
    RETURN job;
END;
$$;

-- Seed 002's memoryLine: a line a character's reply asked to keep about the shared story.
-- The worker calls this inside the turn's completion with the turn's own user, character
-- and assistant message id; the lane screens, grounds and stores it under `__lore__`.
CREATE OR REPLACE FUNCTION kvmem_remember_line(
    p_user text, p_character bigint, p_text text, p_message_id text
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    job bigint;
BEGIN
    PERFORM kvmem_memory_check(p_user, p_text);
    INSERT INTO memory_jobs (user_id, character_id, kind, payload)
    VALUES (p_user, p_character, 'line',
            jsonb_build_object('text', btrim(p_text), 'message_id', p_message_id))
    RETURNING id INTO job;
    PERFORM pg_notify('kvmem_memory', job::text);
    RETURN job;
END;
$$;

-- Seed 004's "remember this about Florent" with no fact given: the lane summarises what
-- the session's recent messages (up to turn p_turn) say about the person and remembers
-- that like an explicit remember. The job's result says what was stored.
CREATE OR REPLACE FUNCTION kvmem_remember_about(
    p_user text, p_character bigint, p_name text, p_session text, p_turn bigint
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    job bigint;
BEGIN
    IF p_user IS NULL OR btrim(p_user) = '' THEN
        RAISE EXCEPTION 'user_id must not be empty' USING ERRCODE = '22023';
    END IF;
    IF p_name IS NULL OR length(btrim(p_name)) < 2 OR length(p_name) > 80 THEN
        RAISE EXCEPTION 'name must have 2 to 80 characters' USING ERRCODE = '22023';
    END IF;
    INSERT INTO memory_jobs (user_id, character_id, kind, payload)
    VALUES (p_user, p_character, 'remember_about',
            jsonb_build_object('name', btrim(p_name), 'session_id', p_session, 'turn_id', p_turn))
    RETURNING id INTO job;
    PERFORM pg_notify('kvmem_memory', job::text);
    RETURN job;
END;
$$;
