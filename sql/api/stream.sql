-- Replies that stream (issue 47): how a backend reads a turn's reply while the worker
-- generates it, with plain SQL.
--
--   SELECT kvmem_listen_turn(17);          -- LISTEN on turn 17's channel; returns its name
--   SELECT * FROM kvmem_turn_stream(17);   -- what was generated so far (state, attempt, seq, text, done, meta)
--   -- then each notification's payload is a delta:
--   -- {"turn_id":17,"attempt":41,"seq":3,"reset":false,"text":" there","done":false}
--   -- and the turn's end is {"turn_id":17,"session_id":"s1","state":"done"} (or failed/dead).
--
-- A delta's `text` is cut on UTF-8 boundaries and holds only what the stored reply will
-- hold. `attempt` grows with every run of the turn (it is the run's fencing token); seq 0 of
-- an attempt has `reset` true: drop whatever text an earlier attempt sent. `done` says this
-- attempt's text is whole; the turn's reply is stored (turns.reply, equal to the attempt's
-- deltas joined) when the state message says `done`. Payloads stay under 8,000 bytes.
--
-- Channel names are derived here, so backends never compute them: one channel per turn,
-- and one per session (a hash of the session id, which is arbitrary text) carrying every
-- turn of that session. Postgres does not restrict LISTEN: any role that can connect can
-- listen on any channel, as it can read the turns table. Tenancy is the backend's.

CREATE OR REPLACE FUNCTION kvmem_turn_channel(p_turn_id bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'kvmem_stream_' || p_turn_id::text
$$;

CREATE OR REPLACE FUNCTION kvmem_session_channel(p_session_id text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'kvmem_stream_s_' || md5(p_session_id)
$$;

-- LISTEN on a turn's (or a session's) channel in the calling session; returns its name.
-- As with LISTEN itself, inside a transaction it takes effect at commit.
CREATE OR REPLACE FUNCTION kvmem_listen_turn(p_turn_id bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_channel text := kvmem_turn_channel(p_turn_id);
BEGIN
    EXECUTE format('LISTEN %I', v_channel);
    RETURN v_channel;
END
$$;

CREATE OR REPLACE FUNCTION kvmem_listen_session(p_session_id text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_channel text := kvmem_session_channel(p_session_id);
BEGIN
    EXECUTE format('LISTEN %I', v_channel);
    RETURN v_channel;
END
$$;

-- What a turn has generated so far, for a reader that arrives late or missed a
-- notification: LISTEN first, then call this, then apply only deltas of a larger attempt,
-- or of this attempt with a larger seq. One row (none for an unknown turn):
--   state    the turn's state (queued, running, done, failed, dead)
--   attempt  the newest attempt that streamed (for a done turn: the one that committed)
--   seq      the last delta of that attempt joined into text (NULL when the turn is done
--            and its deltas are gone: text is then the stored reply)
--   text     the attempt's text so far; for a done turn, the stored reply
--   done     the text is whole (always true for a done turn)
--   meta     what the attempt's first delta carried (cold, digest_injected, digest_version)
CREATE OR REPLACE FUNCTION kvmem_turn_stream(p_turn_id bigint)
RETURNS TABLE (state text, attempt bigint, seq integer, text text, done boolean, meta jsonb)
LANGUAGE sql STABLE AS $$
    WITH t AS (
        SELECT tt.state::text AS state, tt.reply, tt.done_token
          FROM turns tt WHERE tt.id = p_turn_id
    ), latest AS (
        SELECT max(d.attempt) AS attempt FROM turn_stream_deltas d WHERE d.turn_id = p_turn_id
    ), numbered AS (
        SELECT d.seq, d.text, d.done, d.meta, row_number() OVER (ORDER BY d.seq) - 1 AS n
          FROM turn_stream_deltas d, latest l
         WHERE d.turn_id = p_turn_id AND d.attempt = l.attempt
    ), run AS (
        -- The deltas from seq 0 on without a gap (a gap only follows a server crash, which
        -- empties the unlogged table).
        SELECT max(r.seq) AS seq, string_agg(r.text, '' ORDER BY r.seq) AS text,
               bool_or(r.done) AS done, (array_agg(r.meta ORDER BY r.seq))[1] AS meta
          FROM numbered r WHERE r.seq = r.n
    )
    SELECT t.state,
           CASE WHEN t.state = 'done' THEN t.done_token ELSE l.attempt END,
           CASE WHEN t.state = 'done' AND l.attempt IS DISTINCT FROM t.done_token THEN NULL
                ELSE r.seq END,
           CASE WHEN t.state = 'done' THEN t.reply ELSE coalesce(r.text, '') END,
           t.state = 'done' OR coalesce(r.done, false),
           r.meta
      FROM t CROSS JOIN latest l CROSS JOIN run r
$$;

-- The worker's side (sql/stream/publish.sql): store a batch of deltas and notify each on
-- its turn's and its session's channel, in order. $1 is a JSON array of
-- {turn_id, session_id, attempt, seq, text, done, meta, payload}; payload is the exact
-- notification text. Deltas are a cache of a reply that the completion stores durably, so
-- this transaction does not wait for its WAL flush: a NOTIFY holds a cluster-wide lock
-- through its commit, and a flush per delta would serialise every stream behind fsync.
CREATE OR REPLACE FUNCTION kvmem_stream_publish(p_deltas jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    d record;
    n integer := 0;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO turn_stream_deltas (turn_id, attempt, seq, text, done, meta)
    SELECT x.turn_id, x.attempt, x.seq, x.text, x.done, x.meta
      FROM jsonb_to_recordset(p_deltas)
           AS x(turn_id bigint, attempt bigint, seq integer, text text, done boolean, meta jsonb)
     -- An erased turn's deltas are not stored: the key-share lock makes an erase running
     -- now wait for this insert, then delete what it stored.
     WHERE EXISTS (SELECT 1 FROM turns t WHERE t.id = x.turn_id FOR KEY SHARE)
    ON CONFLICT DO NOTHING;
    FOR d IN
        SELECT (e.v->>'turn_id')::bigint AS turn_id, e.v->>'session_id' AS session_id,
               e.v->>'payload' AS payload
          FROM jsonb_array_elements(p_deltas) WITH ORDINALITY AS e(v, ord)
         ORDER BY e.ord
    LOOP
        PERFORM pg_notify(kvmem_turn_channel(d.turn_id), d.payload);
        PERFORM pg_notify(kvmem_session_channel(d.session_id), d.payload);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;
