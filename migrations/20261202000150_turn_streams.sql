-- Replies that stream (issue 47). The worker publishes each turn's reply as deltas while it
-- generates; a reader that arrives late, or missed a notification, reads what was generated
-- so far from here (kvmem_turn_stream, sql/api/stream.sql).
--
-- One row per delta, appended: a growing row rewritten per token would copy the reply again
-- on every delta. UNLOGGED, because the rows are a cache of a reply that is either still
-- being generated or already stored in turns.reply: they write no WAL, and after a server
-- crash (which empties the table) readers fall back to the notifications and turns.reply.
-- attempt is the run's fencing token (session_locks.fencing_token at claim): every run of a
-- turn, a retry or a re-run after a reaped lease, has a larger one, so the newest attempt
-- is the one with the largest number. The reaper deletes rows after ten minutes.
CREATE UNLOGGED TABLE turn_stream_deltas (
    turn_id    bigint      NOT NULL,
    attempt    bigint      NOT NULL,
    seq        integer     NOT NULL,
    text       text        NOT NULL,
    -- This attempt's reply text is whole after this delta.
    done       boolean     NOT NULL DEFAULT false,
    -- On seq 0: what the turn knew when it started generating (cold, digest_injected, ...).
    meta       jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (turn_id, attempt, seq)
);
CREATE INDEX turn_stream_deltas_created_idx ON turn_stream_deltas (created_at);

-- OpenAI's usage: the prompt the reply was conditioned on is what the KV held when
-- generation started (served from the snapshot) plus what this turn prefilled.
ALTER TABLE turn_log ADD COLUMN prompt_tokens integer NOT NULL DEFAULT 0;
