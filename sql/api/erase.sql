-- Erasure (docs/operations.md#erasure): every row of one user, one character or one
-- session, in one transaction, in every table that holds it.
--
--   SELECT kvmem_erase_user('user_1');
--   SELECT kvmem_erase_character(42);
--   SELECT kvmem_erase_session('session_123');            -- or ('session_123', 'user_1')
--
-- Each returns {"kind", "subject", "tables": {table: rows removed}, "scopes": [...]} and
-- records one `erased` event holding no content: the subject's keyed hash (HMAC-SHA-256
-- under the database's own `erase_audit` secret), the counts, the time. A second call removes nothing and says so. `scopes` are the snapshot scopes to
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

-- The audit event's subject: the kind and a keyed hash of the id, never the id. The key
-- (kvmem_secrets 'erase_audit', made by the first migrate) stays in the database, so the
-- hash of a guessable id cannot be found by hashing guesses outside it; inside it, the
-- same id always gives the same subject, which is what a second erase and a late lane job
-- match on.
CREATE OR REPLACE FUNCTION kvmem_erase_subject(p_kind text, p_id text) RETURNS text
LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT p_kind || ':' || encode(hmac(convert_to(p_id, 'UTF8'),
               (SELECT secret FROM kvmem_secrets WHERE name = 'erase_audit'), 'sha256'), 'hex')
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
    v_derived  bigint[];
    v_counts   jsonb := '{}'::jsonb;
    n          bigint;
BEGIN
    -- Lock order, the turn path's own: each session's enqueue lock (kvmem_enqueue_turn's),
    -- so no turn is queued into a session while it goes; then the sessions' lease rows in
    -- session order (a completion's fence, fence_many.sql), so a completion in flight
    -- commits, its log row with it, before anything below reads; then the digest locks (a
    -- rebuild holding one finishes before its row is deleted; one waiting sees them gone).
    PERFORM pg_advisory_xact_lock(hashtextextended('kvmem:' || s, 0))
       FROM (SELECT DISTINCT s FROM unnest(p_sessions) s ORDER BY 1) x;
    PERFORM 1 FROM session_locks WHERE session_id = ANY(p_sessions)
     ORDER BY session_id FOR UPDATE;
    PERFORM pg_advisory_xact_lock(hashtextextended('kvmem:digest:' || s, 0))
       FROM (SELECT DISTINCT s FROM unnest(p_sessions) s ORDER BY 1) x;

    -- A character's rows are its users': a public character is many users', and only
    -- those of p_users go (all of them when the character itself is erased).
    SELECT coalesce(array_agg(id), '{}') INTO v_turns
      FROM turns
     WHERE session_id = ANY(p_sessions)
        OR (p_whole_user AND user_id = ANY(p_users))
        OR (character_id = ANY(p_characters) AND user_id = ANY(p_users));
    SELECT coalesce(array_agg(id), '{}'), coalesce(array_agg(DISTINCT message_id), '{}'),
           coalesce(array_agg(DISTINCT guild_id) FILTER (WHERE guild_id <> ''), '{}')
      INTO v_mm, v_keys, v_guilds
      FROM memory_messages
     WHERE user_id = ANY(p_users)
       AND (p_whole_user OR session_id = ANY(p_sessions) OR character_id = ANY(p_characters));
    -- Chat turns are cited as turn:<id>:user and turn:<id>:assistant.
    v_keys := v_keys || ARRAY(SELECT 'turn:' || t || ':' || r
                                FROM unnest(v_turns) t, unnest(ARRAY['user', 'assistant']) r);
    -- The characters whose user-wide summaries were built over these sessions' words: a
    -- session's erase removes them too, to be summarised again from what is left.
    SELECT coalesce(array_agg(DISTINCT c), '{}') INTO v_derived FROM (
        SELECT character_id AS c FROM turns WHERE id = ANY(v_turns)
        UNION SELECT character_id FROM memory_messages WHERE id = ANY(v_mm)
        UNION SELECT unnest(p_characters)) x WHERE c IS NOT NULL;

    SELECT coalesce(array_agg(DISTINCT scope), '{}') INTO v_scopes FROM (
        SELECT kvmem_scope_key(user_id, character_id, session_id) AS scope
          FROM turns WHERE id = ANY(v_turns)
        UNION
        SELECT kvmem_scope_key(user_id, character_id, session_id)
          FROM session_kv
         WHERE session_id = ANY(p_sessions)
            OR (character_id = ANY(p_characters) AND user_id = ANY(p_users))
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
        OR (detail->>'character_id' = ANY(p_characters::text[])
            AND (p_kind = 'character' OR detail->>'user_id' = ANY(p_users)
                 OR (NOT detail ? 'user_id'
                     AND EXISTS (SELECT 1 FROM user_characters uc
                                  WHERE uc.id::text = detail->>'character_id'
                                    AND NOT uc.public))));
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
     WHERE session_id = ANY(p_sessions)
        OR (character_id = ANY(p_characters) AND user_id = ANY(p_users))
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
    -- Queued lane work carrying these words: an ingest of their dialogue, an in-chat
    -- remember (its source turn), a reply's memory line (its message), a "remember this
    -- about" (its session).
    DELETE FROM memory_jobs
     WHERE user_id = ANY(p_users)
       AND (p_whole_user OR character_id = ANY(p_characters) OR memory_message_id = ANY(v_mm)
            OR payload->>'source' = ANY(v_keys) OR payload->>'message_id' = ANY(v_keys)
            OR payload->>'session_id' = ANY(p_sessions));
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
        DELETE FROM api_keys WHERE user_id = ANY(p_users);
        GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('api_keys', n);
    ELSE
        PERFORM kvmem_erase_relex(p_users);
        -- The rendered memory blob holds remembered texts that may be gone now: it is
        -- rendered again on the next remember or forget.
        DELETE FROM memory_blobs WHERE user_id = ANY(p_users);
        GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('memory_blobs', n);
        -- Aliases name entities of the user's facts; those no memory left names go.
        DELETE FROM memory_entity_aliases a
         WHERE a.user_id = ANY(p_users)
           AND NOT EXISTS (SELECT 1 FROM memories m
                            WHERE m.user_id = a.user_id
                              AND (a.alias_ref = ANY(m.entity_refs)
                                   OR a.canonical_ref = ANY(m.entity_refs)));
        GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('memory_entity_aliases', n);
    END IF;

    -- Summaries: the characters' own, and the user-wide ones built over them (rebuilt
    -- from what is left).
    DELETE FROM rolling_summaries
     WHERE user_id = ANY(p_users) AND (p_whole_user OR character_id = ANY(v_derived));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('rolling_summaries', n);
    DELETE FROM session_summaries
     WHERE user_id = ANY(p_users) AND (p_whole_user OR character_id = ANY(v_derived));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('session_summaries', n);
    DELETE FROM summary_jobs
     WHERE user_id = ANY(p_users) AND (p_whole_user OR character_id = ANY(v_derived));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('summary_jobs', n);
    DELETE FROM summary_sessions
     WHERE user_id = ANY(p_users) AND (p_whole_user OR character_id = ANY(v_derived));
    GET DIAGNOSTICS n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('summary_sessions', n);
    DELETE FROM session_state
     WHERE user_id = ANY(p_users) AND (p_whole_user OR character_id = ANY(v_derived));
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

    -- The character rows: the user's own on a user's erase (never a public one they only
    -- talked to), the character itself on its own erase; a user's part of a public
    -- character leaves the character.
    DELETE FROM user_characters
     WHERE id = ANY(p_characters)
       AND ((p_whole_user AND user_id = ANY(p_users)) OR p_kind = 'character');
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
              UNION SELECT user_id FROM session_kv WHERE character_id = p_character
              UNION SELECT user_id FROM memory_messages WHERE character_id = p_character
              UNION SELECT user_id FROM memories WHERE character_id = p_character
              UNION SELECT user_id FROM todos WHERE character_id = p_character
              UNION SELECT user_id FROM session_state WHERE character_id = p_character
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

-- One user's part of a character (a public character they talked to): their sessions with
-- it and everything kept or derived from them; the character and every other user's part
-- stay.
CREATE OR REPLACE FUNCTION kvmem_erase_user_character(p_user text, p_character bigint)
RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF p_user IS NULL OR btrim(p_user) = '' OR p_character IS NULL THEN
        RAISE EXCEPTION 'kvmem_erase_user_character: user and character are required'
              USING ERRCODE = '22023';
    END IF;
    RETURN kvmem_erase_sets('user_character',
        kvmem_erase_subject('user_character', p_user || '/' || p_character),
        ARRAY[p_user], ARRAY[p_character],
        ARRAY(SELECT session_id FROM turns WHERE user_id = p_user AND character_id = p_character
              UNION SELECT session_id FROM session_kv
                     WHERE user_id = p_user AND character_id = p_character),
        false, true);
END
$$;

-- The sessions a front-end shows as one chat with p_session: those branched from it (a
-- regenerate or an edit copies its dialogue up to a turn into a new session), those it was
-- branched from, and theirs, to the end. Their copies hold its words.
CREATE OR REPLACE FUNCTION kvmem_session_family(p_session text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_all  text[] := ARRAY[p_session];
    v_next text[];
BEGIN
    LOOP
        SELECT coalesce(array_agg(DISTINCT s), '{}') INTO v_next FROM (
            SELECT b.session_id AS s FROM turns src JOIN turns b ON b.copied_from = src.id
             WHERE src.session_id = ANY(v_all) AND b.origin = 'branch'
            UNION
            SELECT src.session_id FROM turns b JOIN turns src ON src.id = b.copied_from
             WHERE b.session_id = ANY(v_all) AND b.origin = 'branch'
        ) x WHERE NOT s = ANY(v_all);
        EXIT WHEN cardinality(v_next) = 0;
        v_all := v_all || v_next;
    END LOOP;
    RETURN v_all;
END
$$;

-- p_user: only that user's part of the session (an imported session id is the user's own
-- name for it, and two users may use the same one); a chat session another user also
-- has turns in is refused. The session's branches go with it (kvmem_session_family).
CREATE OR REPLACE FUNCTION kvmem_erase_session(p_session text, p_user text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_sessions text[];
BEGIN
    IF p_session IS NULL OR btrim(p_session) = '' THEN
        RAISE EXCEPTION 'kvmem_erase_session: session_id is empty' USING ERRCODE = '22023';
    END IF;
    v_sessions := kvmem_session_family(p_session);
    IF p_user IS NOT NULL AND EXISTS (SELECT 1 FROM turns
                                       WHERE session_id = ANY(v_sessions) AND user_id <> p_user) THEN
        RAISE EXCEPTION 'kvmem_erase_session: session % is not only user %''s', p_session, p_user
              USING ERRCODE = '22023';
    END IF;
    RETURN kvmem_erase_sets('session', kvmem_erase_subject('session', p_session),
        CASE WHEN p_user IS NOT NULL THEN ARRAY[p_user] ELSE
        ARRAY(SELECT user_id FROM turns WHERE session_id = ANY(v_sessions)
              UNION SELECT user_id FROM session_kv WHERE session_id = ANY(v_sessions)
              UNION SELECT user_id FROM memory_messages WHERE session_id = ANY(v_sessions)) END,
        '{}'::bigint[], v_sessions, false, true);
END
$$;

-- A lane job that was running when its user, character or session was erased ends here:
-- whatever it wrote after the erase goes too, and nothing else. What it wrote is told by
-- where it came from, not by when: memories and todos citing only dialogue that no longer
-- exists, the rendered blob and the entity aliases no memory names (both derived, rebuilt
-- later), the user's lexicon recounted from the dialogue left. Rows of a user id reused
-- after the erase cite the new dialogue, or nothing, and stay. Only when an erase naming
-- the job's user, character or any session of the user happened in the last p_within_secs
-- seconds (a lane's stale-job age). Returns 1 when it cleaned up, else 0.
CREATE OR REPLACE FUNCTION kvmem_erase_late(p_user text, p_character bigint, p_within_secs double precision)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_orphans bigint[];
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM events
         WHERE kind = 'erased' AND created_at > now() - make_interval(secs => p_within_secs)
           AND (detail->>'subject' IN (kvmem_erase_subject('user', p_user),
                                       kvmem_erase_subject('character', coalesce(p_character::text, '')))
                OR detail->>'subject' LIKE 'session:%')) THEN
        RETURN 0;
    END IF;
    -- Written within the window (a memory of old dialogue whose turns retention removed
    -- long ago is not the job's).
    DELETE FROM memories m
     WHERE m.user_id = p_user AND cardinality(m.source_message_ids) > 0
       AND m.created_at > now() - make_interval(secs => p_within_secs)
       AND NOT EXISTS (SELECT 1 FROM memory_messages mm
                        WHERE mm.user_id = p_user AND mm.message_id = ANY(m.source_message_ids))
       AND NOT EXISTS (SELECT 1 FROM turns t
                        WHERE t.user_id = p_user
                          AND ('turn:' || t.id || ':user' = ANY(m.source_message_ids)
                               OR 'turn:' || t.id || ':assistant' = ANY(m.source_message_ids)));
    DELETE FROM todos d
     WHERE d.user_id = p_user AND cardinality(d.source_message_ids) > 0
       AND d.created_at > now() - make_interval(secs => p_within_secs)
       AND NOT EXISTS (SELECT 1 FROM memory_messages mm
                        WHERE mm.user_id = p_user AND mm.message_id = ANY(d.source_message_ids))
       AND NOT EXISTS (SELECT 1 FROM turns t
                        WHERE t.user_id = p_user
                          AND ('turn:' || t.id || ':user' = ANY(d.source_message_ids)
                               OR 'turn:' || t.id || ':assistant' = ANY(d.source_message_ids)));
    DELETE FROM memory_blobs WHERE user_id = p_user;
    DELETE FROM memory_entity_aliases a
     WHERE a.user_id = p_user
       AND NOT EXISTS (SELECT 1 FROM memories m
                        WHERE m.user_id = p_user
                          AND (a.alias_ref = ANY(m.entity_refs) OR a.canonical_ref = ANY(m.entity_refs)));
    -- Summaries of a character the user has no dialogue with any more were built from
    -- erased words; so were the user-wide ones when no dialogue of the user is left.
    SELECT coalesce(array_agg(DISTINCT c), '{}') INTO v_orphans FROM (
        SELECT character_id AS c FROM session_state WHERE user_id = p_user
        UNION SELECT character_id FROM summary_sessions WHERE user_id = p_user
        UNION SELECT character_id FROM summary_jobs WHERE user_id = p_user) x
     WHERE c IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM memory_messages mm WHERE mm.user_id = p_user AND mm.character_id = c)
       AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.user_id = p_user AND t.character_id = c);
    DELETE FROM rolling_summaries WHERE user_id = p_user AND character_id = ANY(v_orphans);
    DELETE FROM session_summaries WHERE user_id = p_user AND character_id = ANY(v_orphans);
    DELETE FROM summary_jobs WHERE user_id = p_user AND character_id = ANY(v_orphans);
    DELETE FROM summary_sessions WHERE user_id = p_user AND character_id = ANY(v_orphans);
    DELETE FROM session_state WHERE user_id = p_user AND character_id = ANY(v_orphans);
    IF NOT EXISTS (SELECT 1 FROM memory_messages WHERE user_id = p_user)
       AND NOT EXISTS (SELECT 1 FROM turns WHERE user_id = p_user) THEN
        DELETE FROM summary_spine WHERE user_id = p_user;
        DELETE FROM historical_summaries WHERE user_id = p_user;
        DELETE FROM user_contexts WHERE user_id = p_user;
        DELETE FROM daily_summaries WHERE scope = 'user:' || p_user;
    END IF;
    PERFORM kvmem_erase_relex(ARRAY[p_user]);
    RETURN 1;
END
$$;
