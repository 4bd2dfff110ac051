-- The backend's entry point: validate a chat turn and queue it.
--
--   SELECT kvmem_enqueue_turn('session_123', 'user_1', 42, 'Hello there');
--   SELECT kvmem_enqueue_turn('session_123', 'user_1', 42, 'Hello there', 'req-7f3a');
--   SELECT kvmem_enqueue_turn('session_123', 'user_1', 42, 'Hello there',
--                             options => '{"temperature": 0.8, "seed": 7, "stop": ["\n\n"]}');
--
-- `lane` is 'live' for backends; `kvmem replay` queues on 'replay', which workers take
-- only when no live turn is ready.
-- Returns the turn id. With an idempotency key, a repeated call returns the
-- first call's turn instead of queueing another. Bad input raises SQLSTATE
-- 22023 (invalid_parameter_value) or P0002 (unknown character) and queues nothing.
-- Completion is announced on channel `kvmem_turn_done` (JSON payload).
--
-- `options` (null: the worker's configured sampling) is the turn's own sampling, checked
-- by kvmem_check_turn_options below: an object of at most these keys, each optional:
--   temperature  number 0..2 (0: greedy)      top_p       number in (0, 1]
--   seed         integer 0..4294967295        stop        array of 1..16 non-empty strings
--   max_tokens   integer >= 1 (the worker caps it at REPLY_MAX_TOKENS)    of at most 64 characters
-- Integers are JSON integers (7, not 7.0): the worker reads them as integers, and a turn
-- that fails there is worse than a request refused here.
DROP FUNCTION IF EXISTS kvmem_enqueue_turn(text, text, bigint, text, text);
DROP FUNCTION IF EXISTS kvmem_enqueue_turn(text, text, bigint, text, text, text);

-- Raises 22023 naming the first bad key of a turn's `options`; returns them unchanged.
CREATE OR REPLACE FUNCTION kvmem_check_turn_options(options jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
    n numeric;
BEGIN
    IF options IS NULL OR options = 'null'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(options) <> 'object' THEN
        RAISE EXCEPTION 'kvmem: options must be a JSON object' USING ERRCODE = '22023';
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(options) LOOP
        IF k NOT IN ('temperature', 'top_p', 'seed', 'stop', 'max_tokens') THEN
            RAISE EXCEPTION 'kvmem: unknown option %; allowed: temperature, top_p, seed, stop, max_tokens', k
                USING ERRCODE = '22023';
        END IF;
        IF k = 'stop' THEN
            IF jsonb_typeof(v) <> 'array' OR jsonb_array_length(v) NOT BETWEEN 1 AND 16
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(v) e
                           WHERE jsonb_typeof(e) <> 'string' OR e #>> '{}' = ''
                              OR char_length(e #>> '{}') > 64) THEN
                RAISE EXCEPTION 'kvmem: option stop must be an array of 1 to 16 non-empty strings of at most 64 characters'
                    USING ERRCODE = '22023';
            END IF;
            CONTINUE;
        END IF;
        IF jsonb_typeof(v) <> 'number' THEN
            RAISE EXCEPTION 'kvmem: option % must be a number', k USING ERRCODE = '22023';
        END IF;
        IF k IN ('seed', 'max_tokens') AND v::text !~ '^-?[0-9]+$' THEN
            RAISE EXCEPTION 'kvmem: option % is %, not a whole number written as one (7, not 7.0)', k, v
                USING ERRCODE = '22023';
        END IF;
        n := v::numeric;
        IF (k = 'temperature' AND n NOT BETWEEN 0 AND 2)
           OR (k = 'top_p' AND (n <= 0 OR n > 1))
           OR (k = 'seed' AND (n <> trunc(n) OR n NOT BETWEEN 0 AND 4294967295))
           OR (k = 'max_tokens' AND (n <> trunc(n) OR n < 1 OR n > 2147483647)) THEN
            RAISE EXCEPTION 'kvmem: option % is %, out of its range (%)', k, v,
                CASE k WHEN 'temperature' THEN '0 to 2'
                       WHEN 'top_p' THEN 'above 0, at most 1'
                       WHEN 'seed' THEN 'a whole number, 0 to 4294967295'
                       ELSE 'a whole number, at least 1' END
                USING ERRCODE = '22023';
        END IF;
    END LOOP;
    RETURN options;
END;
$$;
CREATE OR REPLACE FUNCTION kvmem_enqueue_turn(
    session_id      text,
    user_id         text,
    character_id    bigint,
    message         text,
    idempotency_key text DEFAULT NULL,
    lane            text DEFAULT 'live',
    options         jsonb DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_limit    integer;
    v_owner    text;
    v_existing record;
    v_id       bigint;
    v_attempts integer;
BEGIN
    IF session_id IS NULL OR btrim(session_id) = '' THEN
        RAISE EXCEPTION 'kvmem: session_id must not be blank' USING ERRCODE = '22023';
    END IF;
    IF length(session_id) > 200 THEN
        RAISE EXCEPTION 'kvmem: session_id is % characters, over the limit of 200', length(session_id)
            USING ERRCODE = '22023';
    END IF;
    IF user_id IS NULL OR btrim(user_id) = '' THEN
        RAISE EXCEPTION 'kvmem: user_id must not be blank' USING ERRCODE = '22023';
    END IF;
    IF lane IS NULL OR lane NOT IN ('live', 'replay') THEN
        RAISE EXCEPTION 'kvmem: lane must be live or replay' USING ERRCODE = '22023';
    END IF;
    IF message IS NULL OR btrim(message) = '' THEN
        RAISE EXCEPTION 'kvmem: message must not be empty' USING ERRCODE = '22023';
    END IF;
    SELECT value::integer INTO v_limit FROM kvmem_config WHERE key = 'max_message_chars';
    IF length(message) > coalesce(v_limit, 8000) THEN
        RAISE EXCEPTION 'kvmem: message is % characters, over the limit of % (kvmem_config.max_message_chars)',
            length(message), coalesce(v_limit, 8000) USING ERRCODE = '22023';
    END IF;
    -- Text cannot hold NUL (Postgres rejects it before we run); other control
    -- characters are refused here so they never reach the tokenizer.
    IF message ~ '[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]' THEN
        RAISE EXCEPTION 'kvmem: message contains control characters' USING ERRCODE = '22023';
    END IF;
    options := kvmem_check_turn_options(options);

    -- The user's own character, or a public one (anyone may talk to it, each user in
    -- their own sessions).
    SELECT uc.user_id INTO v_owner FROM user_characters uc
     WHERE uc.id = character_id AND (uc.user_id = kvmem_enqueue_turn.user_id OR uc.public);
    IF NOT FOUND THEN
        -- A foreign character is reported like a missing one: ids of other users do not leak.
        RAISE EXCEPTION 'kvmem: unknown character % for user %', character_id, user_id
            USING ERRCODE = 'P0002';
    END IF;

    -- Serialise enqueues per session so ids, and so run order, follow commit order.
    PERFORM pg_advisory_xact_lock(hashtextextended('kvmem:' || session_id, 0));

    -- Ownership first: nothing below may answer for a session that is not the caller's.
    -- A session belongs to one user and one character: its memory is theirs alone.
    PERFORM 1 FROM turns t
     WHERE t.session_id = session_id
       AND (t.user_id <> user_id OR t.character_id <> character_id)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'kvmem: session % belongs to another user or character', session_id
            USING ERRCODE = '22023';
    END IF;

    -- Idempotency keys are per user: another user's identical key is another request, and
    -- is never looked at.
    IF idempotency_key IS NOT NULL THEN
        SELECT t.id, t.session_id INTO v_existing FROM turns t
         WHERE t.user_id = user_id AND t.idempotency_key = idempotency_key;
        IF FOUND THEN
            IF v_existing.session_id <> session_id THEN
                RAISE EXCEPTION 'kvmem: idempotency key % was already used for another session',
                    idempotency_key USING ERRCODE = '22023';
            END IF;
            RETURN v_existing.id;
        END IF;
    END IF;

    SELECT value::integer INTO v_attempts FROM kvmem_config WHERE key = 'max_attempts';
    INSERT INTO turns (session_id, user_id, character_id, message, idempotency_key, max_attempts, lane, options)
    VALUES (session_id, user_id, character_id, message, idempotency_key, coalesce(v_attempts, 5), lane, options)
    ON CONFLICT DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        -- A concurrent call of this user with the same key won the insert. Calls for one
        -- session are serialised above, so the winner may only be another session's.
        SELECT t.id, t.session_id INTO v_existing FROM turns t
         WHERE t.user_id = user_id AND t.idempotency_key = idempotency_key;
        IF v_existing.session_id <> session_id THEN
            RAISE EXCEPTION 'kvmem: idempotency key % was already used for another session',
                idempotency_key USING ERRCODE = '22023';
        END IF;
        RETURN v_existing.id;
    END IF;

    -- The new turn becomes the session's head if the session had nothing pending.
    INSERT INTO session_locks AS l (session_id, head_turn_id, head_run_at, head_lane)
    VALUES (session_id, v_id, now(), lane)
    -- Named constraint: in this function a bare `session_id` means the parameter.
    ON CONFLICT ON CONSTRAINT session_locks_pkey DO UPDATE
       SET head_turn_id = COALESCE(l.head_turn_id, EXCLUDED.head_turn_id),
           head_run_at  = COALESCE(l.head_run_at, EXCLUDED.head_run_at),
           head_lane    = COALESCE(l.head_lane, EXCLUDED.head_lane);

    PERFORM pg_notify('kvmem_turns', session_id);
    RETURN v_id;
END;
$$;
