-- Seed 000's world-state tables: characters, equipment, facts, digests, events.

CREATE TABLE equipment (
    id              bigserial PRIMARY KEY,
    equipment_name  text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE user_characters (
    id                   bigserial PRIMARY KEY,
    user_id              text        NOT NULL,
    name                 text        NOT NULL,
    persona              text        NOT NULL DEFAULT '',
    current_health       integer     NOT NULL DEFAULT 100,
    -- Seed 000 lists both `health` and `current_health`; `health` is kept as a
    -- read-only alias so the two can never disagree.
    health               integer     GENERATED ALWAYS AS (current_health) STORED,
    max_health           integer     NOT NULL DEFAULT 100,
    wallet               bigint      NOT NULL DEFAULT 0,
    stress_level         integer     NOT NULL DEFAULT 0,
    team_trust           integer     NOT NULL DEFAULT 50,
    mental_health        integer     NOT NULL DEFAULT 50,
    battle_focus         integer     NOT NULL DEFAULT 50,
    primary_equipment_id bigint      REFERENCES equipment(id) ON DELETE SET NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX user_characters_user_idx ON user_characters (user_id, id);

CREATE TABLE facts (
    id          bigserial PRIMARY KEY,
    session_id  text        NOT NULL,
    type        text        NOT NULL,
    key         text        NOT NULL,
    value       text        NOT NULL,
    status      text        NOT NULL DEFAULT 'active'
                CHECK (status IN ('active', 'resolved', 'archived')),
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz,
    expires_at  timestamptz,
    UNIQUE (session_id, type, key)
);
CREATE INDEX facts_active_idx ON facts (session_id) WHERE status = 'active';
CREATE INDEX facts_expiry_idx ON facts (expires_at) WHERE status = 'active' AND expires_at IS NOT NULL;

CREATE TABLE state_digest (
    session_id     text        PRIMARY KEY,
    digest_version text        NOT NULL,
    digest_content text        NOT NULL,
    digest_tokens  integer     NOT NULL DEFAULT 0,
    fact_count     integer     NOT NULL DEFAULT 0,
    -- When the digest content next changes without a write: the earliest expires_at
    -- of an included fact. The rebuilder schedules itself for then.
    next_expiry_at timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- NOTIFY is only a doorbell: this marker is the durable record that a session's
-- digest must be rebuilt. It is written in the same transaction as the fact change.
CREATE TABLE digest_dirty (
    session_id text        PRIMARY KEY,
    marked_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE events (
    id         bigserial PRIMARY KEY,
    session_id text,
    turn_id    bigint,
    kind       text        NOT NULL,
    detail     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_session_idx ON events (session_id, id);
CREATE INDEX events_created_idx ON events (created_at);

-- Fact changes mark the session dirty and ring the doorbell in the same transaction.
CREATE FUNCTION kvmem_facts_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    sid text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        sid := OLD.session_id;
    ELSE
        sid := NEW.session_id;
    END IF;
    INSERT INTO digest_dirty (session_id) VALUES (sid)
    ON CONFLICT (session_id) DO UPDATE SET marked_at = now();
    PERFORM pg_notify('kvmem_facts', sid);
    IF TG_OP = 'UPDATE' AND OLD.session_id <> NEW.session_id THEN
        INSERT INTO digest_dirty (session_id) VALUES (OLD.session_id)
        ON CONFLICT (session_id) DO UPDATE SET marked_at = now();
        PERFORM pg_notify('kvmem_facts', OLD.session_id);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER facts_changed
AFTER INSERT OR UPDATE OR DELETE ON facts
FOR EACH ROW EXECUTE FUNCTION kvmem_facts_changed();
