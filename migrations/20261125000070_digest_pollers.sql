-- Digest rebuilds under load (ops/bench digest-load).
--
-- A NOTIFY takes a cluster-wide lock that its transaction holds until its commit has
-- flushed the WAL, so transactions that notify commit one at a time. With a NOTIFY on
-- every fact write, a disk that syncs in about 4 ms caps fact writes near 300/s, and every
-- other notifying transaction (enqueues, finished turns) queues behind them. So a
-- rebuilder that sees many notifications polls the dirty markers every few milliseconds
-- instead, and says so here; while any row's `until` lies ahead, fact writes mark their
-- session dirty without ringing. A rebuilder refreshes its row while it polls, so a
-- rebuilder that died stops silencing the doorbell within a second.
CREATE TABLE digest_pollers (
    rebuilder text        PRIMARY KEY,
    until     timestamptz NOT NULL
);

CREATE OR REPLACE FUNCTION kvmem_facts_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    sid  text;
    ring boolean := NOT EXISTS (SELECT 1 FROM digest_pollers WHERE until > clock_timestamp());
BEGIN
    IF TG_OP = 'DELETE' THEN
        sid := OLD.session_id;
    ELSE
        sid := NEW.session_id;
    END IF;
    INSERT INTO digest_dirty (session_id) VALUES (sid)
    ON CONFLICT (session_id) DO UPDATE SET marked_at = now();
    IF ring THEN
        PERFORM pg_notify('kvmem_facts', sid);
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.session_id <> NEW.session_id THEN
        INSERT INTO digest_dirty (session_id) VALUES (OLD.session_id)
        ON CONFLICT (session_id) DO UPDATE SET marked_at = now();
        IF ring THEN
            PERFORM pg_notify('kvmem_facts', OLD.session_id);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

-- The rebuilder asks for the earliest expiry after every batch, and looks for expired
-- digests on every poll: both read this index instead of every session's row.
CREATE INDEX state_digest_expiry_idx ON state_digest (next_expiry_at)
 WHERE next_expiry_at IS NOT NULL;
