-- Live turns feed the memory corpus set by set, not row by row. The row trigger ran the
-- backlog rule once per message, and with a full backlog that rule walks `cap` index
-- entries each time: two thirds of a completion's database time in `ops/queue-profile`.
-- One statement-level trigger now inserts a completion batch's messages together and runs
-- the backlog rule once per user of the batch. The rule is unchanged: the newest `cap`
-- queued ingest jobs of a user stay, older ones are dropped and counted.

-- Queues one ingest job per message (once per message, ever) and applies the backlog rule
-- once per user touched. Returns the ids of the jobs it created.
CREATE FUNCTION kvmem_memory_queue_ingest_many(p_messages bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    cap integer;
    u text;
    over integer;
    created bigint[];
BEGIN
    WITH ins AS (
        INSERT INTO memory_jobs (user_id, character_id, guild_id, kind, memory_message_id)
        SELECT m.user_id, m.character_id, m.guild_id, 'ingest', m.id
          FROM memory_messages m
          JOIN unnest(p_messages) WITH ORDINALITY AS p(id, n) ON p.id = m.id
         ORDER BY p.n
        ON CONFLICT (memory_message_id) WHERE kind = 'ingest' DO NOTHING
        RETURNING id, user_id
    )
    SELECT array_agg(id ORDER BY id) INTO created FROM ins;
    IF created IS NULL THEN
        RETURN;
    END IF;
    SELECT value::integer INTO cap FROM kvmem_config WHERE key = 'memory_backlog_max';
    cap := coalesce(cap, 400);
    FOR u IN SELECT DISTINCT j.user_id FROM memory_jobs j WHERE j.id = ANY(created) ORDER BY 1 LOOP
        WITH old AS (
            SELECT id FROM memory_jobs
            WHERE user_id = u AND state = 'queued' AND kind = 'ingest'
            ORDER BY id DESC OFFSET cap
            FOR UPDATE SKIP LOCKED
        )
        UPDATE memory_jobs j SET state = 'dropped', finished_at = now(), error = 'backlog overflow'
        FROM old WHERE j.id = old.id;
        GET DIAGNOSTICS over = ROW_COUNT;
        IF over > 0 THEN
            INSERT INTO memory_job_drops (user_id, dropped) VALUES (u, over)
            ON CONFLICT (user_id) DO UPDATE SET dropped = memory_job_drops.dropped + EXCLUDED.dropped;
        END IF;
    END LOOP;
    RETURN QUERY SELECT unnest(created);
END;
$$;

-- The one-message form stays for callers that queue a single message.
CREATE OR REPLACE FUNCTION kvmem_memory_queue_ingest(p_message bigint) RETURNS bigint
LANGUAGE sql AS $$
    SELECT kvmem_memory_queue_ingest_many(ARRAY[p_message]) LIMIT 1
$$;

DROP TRIGGER messages_to_memory ON messages;
DROP FUNCTION kvmem_messages_to_memory();

-- Inside the completion transaction as before, so a rolled-back turn leaves nothing behind.
CREATE FUNCTION kvmem_messages_to_memory() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    added bigint[];
BEGIN
    WITH ins AS (
        INSERT INTO memory_messages (user_id, character_id, session_id, message_id, speaker, text, at, source)
        SELECT t.user_id, t.character_id, n.session_id, 'turn:' || n.turn_id || ':' || n.role,
               n.role, n.content, n.created_at, 'turn'
          FROM new_messages n
          JOIN turns t ON t.id = n.turn_id
         ORDER BY n.id
        ON CONFLICT (user_id, message_id) DO NOTHING
        RETURNING id
    )
    SELECT array_agg(id ORDER BY id) INTO added FROM ins;
    IF added IS NOT NULL THEN
        PERFORM kvmem_memory_queue_ingest_many(added);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER messages_to_memory AFTER INSERT ON messages
REFERENCING NEW TABLE AS new_messages
FOR EACH STATEMENT EXECUTE FUNCTION kvmem_messages_to_memory();
