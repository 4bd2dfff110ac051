-- An ingest job queued by `kvmem memory import --extract llm` asks for extraction: its
-- payload says so (`{"extract": true}`), and only a lane with an extraction model claims
-- it. Before, a lane without one embedded the message and marked the job done, and the
-- extraction the user asked for was silently lost.
DROP FUNCTION kvmem_memory_queue_ingest_many(bigint[]);

-- Queues one ingest job per message (once per message, ever) with `p_payload`, and applies
-- the backlog rule once per user touched. Returns the ids of the jobs it created.
CREATE FUNCTION kvmem_memory_queue_ingest_many(p_messages bigint[], p_payload jsonb DEFAULT '{}')
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    cap integer;
    u text;
    over integer;
    created bigint[];
BEGIN
    WITH ins AS (
        INSERT INTO memory_jobs (user_id, character_id, guild_id, kind, memory_message_id, payload)
        SELECT m.user_id, m.character_id, m.guild_id, 'ingest', m.id, p_payload
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
