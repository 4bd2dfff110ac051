-- A done turn's chain hash (migration 20261203000200), set by the database itself: a
-- completion that leaves chain_hash NULL (every worker's completion, including a previous
-- release's that never heard of the column) gets it here, in the same statement, so a chat
-- completed by an older worker during a rolling upgrade is still matched by its history.
-- The hash continues the session's previous done turn's; after a turn without one (done
-- before the column existed) there is none, as the matcher expects.
CREATE OR REPLACE FUNCTION kvmem_fill_chain_hash() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_prev_id   bigint;
    v_prev_hash bytea;
BEGIN
    -- One running turn per session, so the previous done turn is settled.
    SELECT q.id, q.chain_hash INTO v_prev_id, v_prev_hash
      FROM turns q
     WHERE q.session_id = NEW.session_id AND q.state = 'done' AND q.id < NEW.id
     ORDER BY q.id DESC LIMIT 1;
    IF v_prev_id IS NULL OR v_prev_hash IS NOT NULL THEN
        NEW.chain_hash := kvmem_chain_hash(v_prev_hash, NEW.message, NEW.reply);
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER turns_chain_hash
    BEFORE UPDATE OF state ON turns
    FOR EACH ROW
    WHEN (NEW.state = 'done' AND OLD.state IS DISTINCT FROM 'done'
          AND NEW.chain_hash IS NULL AND NEW.reply IS NOT NULL)
    EXECUTE FUNCTION kvmem_fill_chain_hash();
