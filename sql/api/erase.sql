-- Erasure (docs/operations.md#erasure): every row of one user, one character or one
-- session, in one transaction, in every table that holds it.
--
--   SELECT kvmem_erase_user('user_1');
--   SELECT kvmem_erase_character(42);
--   SELECT kvmem_erase_session('session_123');            -- or ('session_123', 'user_1')
--
-- Each returns {"kind", "subject", "tables": {table: rows removed}, "scopes": [...]} and
-- records one `erased` event holding no content: the subject's SHA-256, the counts, the
-- time. A second call removes nothing and says so. `scopes` are the snapshot scopes to
-- remove outside Postgres (hashes, see migrations/*_erase.sql): `kvmem erase` and
-- `POST /v1/erase` remove them at once, every worker's maintenance sweep soon after.
--
-- A turn in flight loses its lease here (its session_locks row goes), so its completion,
-- its failure, its snapshot save and its log row are all refused by the fence; its stream
-- deltas are refused by kvmem_stream_publish once its turns row is gone. Queued turns and
-- lane jobs are deleted; a lane job already running finds its row gone when it ends and
-- calls kvmem_erase_late, which erases again what it wrote.

-- Little-endian u64 of a length below 2^32: the framing `snapshot::scope_key` hashes.
CREATE OR REPLACE FUNCTION kvmem_le64(n bigint) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT set_byte(set_byte(set_byte(set_byte('\x0000000000000000'::bytea,
           0, (n & 255)::int), 1, ((n >> 8) & 255)::int),
           2, ((n >> 16) & 255)::int), 3, ((n >> 24) & 255)::int)
$$;

-- A session's snapshot scope, exactly as `snapshot::scope_key` computes it in Rust.
CREATE OR REPLACE FUNCTION kvmem_scope_key(p_user text, p_character bigint, p_session text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT encode(substring(sha256(
               kvmem_le64(octet_length(p_user)) || convert_to(p_user, 'UTF8')
            || kvmem_le64(octet_length(p_character::text)) || convert_to(p_character::text, 'UTF8')
            || kvmem_le64(octet_length(p_session)) || convert_to(p_session, 'UTF8'))
           FROM 1 FOR 16), 'hex')
$$;

-- The audit event's subject: the kind and the SHA-256 of the id, never the id.
CREATE OR REPLACE FUNCTION kvmem_erase_subject(p_kind text, p_id text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT p_kind || ':' || encode(sha256(convert_to(p_id, 'UTF8')), 'hex')
$$;

-- Recounts a user's BM25 statistics from the dialogue rows left (a character's or a
-- session's erase removes some of them; the insert trigger only ever adds).
CREATE OR REPLACE FUNCTION kvmem_erase_relex(p_users text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_lexicon WHERE user_id = ANY(p_users);
    DELETE FROM memory_lexicon_users WHERE user_id = ANY(p_users);
    DELETE FROM memory_speakers WHERE user_id = ANY(p_users);
    INSERT INTO memory_lexicon (user_id, term, df)
    SELECT m.user_id, u.lexeme, count(*)
      FROM memory_messages m, unnest(m.tsv) u
     WHERE m.user_id = ANY(p_users) AND 'A' = ANY(u.weights)
     GROUP BY 1, 2 ORDER BY 1, 2;
    INSERT INTO memory_lexicon_users (user_id, docs, positions)
    SELECT user_id, count(*), sum(kvmem_own_positions(tsv))
      FROM memory_messages WHERE user_id = ANY(p_users) GROUP BY 1 ORDER BY 1;
    INSERT INTO memory_speakers (user_id, speaker, messages)
    SELECT user_id, speaker, count(*)
      FROM memory_messages WHERE user_id = ANY(p_users) GROUP BY 1, 2 ORDER BY 1, 2;
END
$$;

-- The erase itself, over the sets the entry points below resolved. p_whole_user: the
-- users' own rows go too (characters, memories, blobs, aliases, statistics); otherwise
-- only what the characters and sessions hold, and what was derived from them across the
-- user (summaries, statistics) is removed or recounted, to be rebuilt from what is left.
CREATE OR REPLACE FUNCTION kvmem_erase_sets(
    p_kind       text,
    p_subject    text,
    p_users      text[],
    p_characters bigint[],
    p_sessions   text[],
    p_whole_user boolean,
    p_audit      boolean
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_turns    bigint[];
    v_mm       bigint[];
    v_keys     text[];
    v_guilds   text[];
    v_scopes   text[];
    v_counts   jsonb := '{}'::jsonb;
    n          bigint;
BEGIN
    -- Lock order with the turn path: the sessions' digest locks first (a rebuild holding
    -- one finishes before its row is deleted; one waiting sees the rows gone).
    PERFORM pg_advisory_xact_lock(hashtextextended('kvmem:digest:' || s, 0))
       FROM (SELECT DISTINCT s FROM unnest(p_sessions) s ORDER BY 1) x;

    SELECT coalesce(array_agg(id), '{}') INTO v_turns
      FROM turns
     WHERE session_id = ANY(p_sessions)
        OR (p_whole_user AND user_id = ANY(p_users))
        OR character_id = ANY(p_characters);
    SELECT coalesce(array_agg(id), '{}'), coalesce(array_agg(DISTINCT message_id), '{}'),
           coalesce(array_agg(DISTINCT guild_id) FILTER (WHERE guild_id <> ''), '{}')
      INTO v_mm, v_keys, v_guilds
      FROM memory_messages
     WHERE user_id = ANY(p_users)
       AND (p_whole_user OR session_id = ANY(p_sessions) OR character_id = ANY(p_characters));
    -- Chat turns are cited as turn:<id>:user and turn:<id>:assistant.
    v_keys := v_keys || ARRAY(SELECT 'turn:' || t || ':' || r
                                FROM unnest(v_turns) t, unnest(ARRAY['user', 'assistant']) r);

    SELECT coalesce(array_agg(DISTINCT scope), '{}') INTO v_scopes FROM (
        SELECT kvmem_scope_key(user_id, character_id, session_id) AS scope
          FROM turns WHERE id = ANY(v_turns)
        UNION
        SELECT kvmem_scope_key(user_id, character_id, session_id)
          FROM session_kv
         WHERE session_id = ANY(p_sessions) OR character_id = ANY(p_characters)
            OR (p_whole_user AND user_id = ANY(p_users))
    ) x;
    INSERT INTO erased_scopes (scope)
    SELECT unnest(v_scopes) ORDER BY 1
    ON CONFLICT (scope) DO UPDATE SET erased_at = now();

    -- Rows of the turns and sessions.
    DELETE FROM turn_log WHERE turn_id = ANY(v_turns);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('turn_log', n);
    DELETE FROM turn_stream_deltas WHERE turn_id = ANY(v_turns);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('turn_stream_deltas', n);
    DELETE FROM messages WHERE turn_id = ANY(v_turns) OR session_id = ANY(p_sessions);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('messages', n);
    -- Events naming a session, a turn, or (in their detail) the user or a character.
    DELETE FROM events
     WHERE session_id = ANY(p_sessions) OR turn_id = ANY(v_turns)
        OR detail->>'user_id' = ANY(p_users)
        OR detail->>'character_id' = ANY(p_characters::text[]);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('events', n);
    DELETE FROM facts WHERE session_id = ANY(p_sessions);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('facts', n);
    -- After facts: their trigger marks the sessions dirty again.
    DELETE FROM digest_dirty WHERE session_id = ANY(p_sessions);
    DELETE FROM state_digest WHERE session_id = ANY(p_sessions);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('state_digest', n);
    DELETE FROM contexts WHERE session_id = ANY(p_sessions);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('contexts', n);
    DELETE FROM session_compactions WHERE session_id = ANY(p_sessions);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('session_compactions', n);
    -- The lease: a worker running one of these turns is fenced from here on.
    DELETE FROM session_locks WHERE session_id = ANY(p_sessions);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('session_locks', n);
    DELETE FROM session_kv
     WHERE session_id = ANY(p_sessions) OR character_id = ANY(p_characters)
        OR (p_whole_user AND user_id = ANY(p_users));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('session_kv', n);
    DELETE FROM turns WHERE id = ANY(v_turns);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('turns', n);

    -- Long-term memory: what the dialogue rows hold or were cited by.
    DELETE FROM memories
     WHERE user_id = ANY(p_users)
       AND (p_whole_user OR character_id = ANY(p_characters) OR source_message_ids && v_keys);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('memories', n);
    DELETE FROM todos
     WHERE user_id = ANY(p_users)
       AND (p_whole_user OR character_id = ANY(p_characters) OR source_message_ids && v_keys
            OR closed_by_message_id = ANY(v_keys));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('todos', n);
    DELETE FROM memory_jobs
     WHERE user_id = ANY(p_users)
       AND (p_whole_user OR character_id = ANY(p_characters) OR memory_message_id = ANY(v_mm));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('memory_jobs', n);
    DELETE FROM memory_messages WHERE id = ANY(v_mm);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('memory_messages', n);
    IF p_whole_user THEN
        DELETE FROM memory_entity_aliases WHERE user_id = ANY(p_users);
        GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('memory_entity_aliases', n);
        DELETE FROM memory_blobs WHERE user_id = ANY(p_users);
        GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('memory_blobs', n);
        DELETE FROM memory_job_drops WHERE user_id = ANY(p_users);
        GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('memory_job_drops', n);
        DELETE FROM memory_lexicon WHERE user_id = ANY(p_users);
        GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('memory_lexicon', n);
        DELETE FROM memory_lexicon_users WHERE user_id = ANY(p_users);
        DELETE FROM memory_speakers WHERE user_id = ANY(p_users);
    ELSE
        PERFORM kvmem_erase_relex(p_users);
    END IF;

    -- Summaries: the characters' own, and the user-wide ones built over them (rebuilt
    -- from what is left).
    DELETE FROM rolling_summaries
     WHERE user_id = ANY(p_users) AND (p_whole_user OR character_id = ANY(p_characters));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('rolling_summaries', n);
    DELETE FROM session_summaries
     WHERE user_id = ANY(p_users) AND (p_whole_user OR character_id = ANY(p_characters));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('session_summaries', n);
    DELETE FROM summary_jobs
     WHERE user_id = ANY(p_users) AND (p_whole_user OR character_id = ANY(p_characters));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('summary_jobs', n);
    DELETE FROM summary_sessions
     WHERE user_id = ANY(p_users) AND (p_whole_user OR character_id = ANY(p_characters));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('summary_sessions', n);
    DELETE FROM session_state
     WHERE user_id = ANY(p_users) AND (p_whole_user OR character_id = ANY(p_characters));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('session_state', n);
    DELETE FROM summary_spine WHERE user_id = ANY(p_users);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('summary_spine', n);
    DELETE FROM historical_summaries WHERE user_id = ANY(p_users);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('historical_summaries', n);
    DELETE FROM user_contexts WHERE user_id = ANY(p_users);
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('user_contexts', n);
    -- A guild's daily summaries mix its members: they go too, and are summarised again.
    DELETE FROM daily_summaries
     WHERE scope = ANY(ARRAY(SELECT 'user:' || u FROM unnest(p_users) u))
        OR scope = ANY(ARRAY(SELECT 'guild:' || g FROM unnest(v_guilds) g));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('daily_summaries', n);

    DELETE FROM user_characters
     WHERE id = ANY(p_characters) AND (p_whole_user OR p_kind = 'character');
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('user_characters', n);

    IF p_audit THEN
        INSERT INTO events (kind, detail)
        VALUES ('erased', jsonb_build_object('subject', p_subject, 'tables', v_counts,
                                             'scopes', cardinality(v_scopes), 'at', now()));
    END IF;
    RETURN jsonb_build_object('kind', p_kind, 'subject', p_subject, 'tables', v_counts,
                              'scopes', to_jsonb(v_scopes));
END
$$;

-- The user's sets, resolved once for kvmem_erase_user and a late lane job's repeat.
CREATE OR REPLACE FUNCTION kvmem_erase_user_sets(p_user text, p_audit boolean) RETURNS jsonb
LANGUAGE sql AS $$
    SELECT kvmem_erase_sets('user', kvmem_erase_subject('user', p_user), ARRAY[p_user],
        ARRAY(SELECT id FROM user_characters WHERE user_id = p_user
              UNION SELECT character_id FROM turns WHERE user_id = p_user),
        ARRAY(SELECT session_id FROM turns WHERE user_id = p_user
              UNION SELECT session_id FROM session_kv WHERE user_id = p_user),
        true, p_audit)
$$;

CREATE OR REPLACE FUNCTION kvmem_erase_user(p_user text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF p_user IS NULL OR btrim(p_user) = '' THEN
        RAISE EXCEPTION 'kvmem_erase_user: user_id is empty' USING ERRCODE = '22023';
    END IF;
    RETURN kvmem_erase_user_sets(p_user, true);
END
$$;

-- One character's sets; p_users adds owners the character row no longer names (a late
-- lane job's repeat, after the row went).
CREATE OR REPLACE FUNCTION kvmem_erase_character_sets(p_character bigint, p_users text[], p_audit boolean)
RETURNS jsonb
LANGUAGE sql AS $$
    SELECT kvmem_erase_sets('character', kvmem_erase_subject('character', p_character::text),
        ARRAY(SELECT user_id FROM user_characters WHERE id = p_character
              UNION SELECT user_id FROM turns WHERE character_id = p_character
              UNION SELECT unnest(p_users)),
        ARRAY[p_character],
        ARRAY(SELECT session_id FROM turns WHERE character_id = p_character
              UNION SELECT session_id FROM session_kv WHERE character_id = p_character),
        false, p_audit)
$$;

CREATE OR REPLACE FUNCTION kvmem_erase_character(p_character bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF p_character IS NULL THEN
        RAISE EXCEPTION 'kvmem_erase_character: character_id is null' USING ERRCODE = '22023';
    END IF;
    RETURN kvmem_erase_character_sets(p_character, '{}', true);
END
$$;

-- p_user: only that user's part of the session (an imported session id is the user's own
-- name for it, and two users may use the same one); a chat session another user also
-- has turns in is refused.
CREATE OR REPLACE FUNCTION kvmem_erase_session(p_session text, p_user text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF p_session IS NULL OR btrim(p_session) = '' THEN
        RAISE EXCEPTION 'kvmem_erase_session: session_id is empty' USING ERRCODE = '22023';
    END IF;
    IF p_user IS NOT NULL AND EXISTS (SELECT 1 FROM turns
                                       WHERE session_id = p_session AND user_id <> p_user) THEN
        RAISE EXCEPTION 'kvmem_erase_session: session % is not only user %''s', p_session, p_user
              USING ERRCODE = '22023';
    END IF;
    RETURN kvmem_erase_sets('session', kvmem_erase_subject('session', p_session),
        CASE WHEN p_user IS NOT NULL THEN ARRAY[p_user] ELSE
        ARRAY(SELECT user_id FROM turns WHERE session_id = p_session
              UNION SELECT user_id FROM session_kv WHERE session_id = p_session
              UNION SELECT user_id FROM memory_messages WHERE session_id = p_session) END,
        '{}'::bigint[], ARRAY[p_session], false, true);
END
$$;

-- A lane job that was running when its user, character or session was erased ends here:
-- whatever it wrote after the erase goes too. Erasures of the last p_within_secs seconds
-- (a lane's stale-job age) that name the job's user or character are done again, without
-- a second audit event; after a session's erase, the user's memories and todos that cite
-- only dialogue no longer there go. Returns the number of erasures repeated.
CREATE OR REPLACE FUNCTION kvmem_erase_late(p_user text, p_character bigint, p_within_secs double precision)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_user_subject text := kvmem_erase_subject('user', p_user);
    v_char_subject text := kvmem_erase_subject('character', coalesce(p_character::text, ''));
    v_redone integer := 0;
BEGIN
    IF EXISTS (SELECT 1 FROM events
                WHERE kind = 'erased' AND detail->>'subject' = v_user_subject
                  AND created_at > now() - make_interval(secs => p_within_secs)) THEN
        PERFORM kvmem_erase_user_sets(p_user, false);
        v_redone := v_redone + 1;
    ELSIF p_character IS NOT NULL AND EXISTS (
               SELECT 1 FROM events
                WHERE kind = 'erased' AND detail->>'subject' = v_char_subject
                  AND created_at > now() - make_interval(secs => p_within_secs)) THEN
        PERFORM kvmem_erase_character_sets(p_character, ARRAY[p_user], false);
        v_redone := v_redone + 1;
    ELSIF EXISTS (SELECT 1 FROM events
                   WHERE kind = 'erased' AND detail->>'subject' LIKE 'session:%'
                     AND created_at > now() - make_interval(secs => p_within_secs)) THEN
        -- A session of the user was erased: the job cannot name it any more (its message
        -- is gone), so what cites only dialogue that no longer exists goes.
        DELETE FROM memories m
         WHERE m.user_id = p_user AND cardinality(m.source_message_ids) > 0
           AND NOT EXISTS (SELECT 1 FROM memory_messages mm
                            WHERE mm.user_id = p_user
                              AND mm.message_id = ANY(m.source_message_ids));
        DELETE FROM todos t
         WHERE t.user_id = p_user AND cardinality(t.source_message_ids) > 0
           AND NOT EXISTS (SELECT 1 FROM memory_messages mm
                            WHERE mm.user_id = p_user
                              AND mm.message_id = ANY(t.source_message_ids));
        v_redone := v_redone + 1;
    END IF;
    RETURN v_redone;
END
$$;
