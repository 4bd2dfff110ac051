-- Erasure (issue 57): what is left to remove outside Postgres once a user, a character or a
-- session is erased. A snapshot scope is a hash of (user, character, session)
-- (`kvmem_scope_key`, the same as `snapshot::scope_key`), so this holds no content. The
-- command or route that erased removes the scope's files and objects at once; every worker
-- also sweeps its own snapshot directory for these scopes, which catches a copy in another
-- worker's directory and a file a turn in flight wrote after the erase. Rows older than the
-- quarantine retention are dropped by the sweep.
CREATE TABLE erased_scopes (
    scope     text        PRIMARY KEY,
    erased_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX erased_scopes_at_idx ON erased_scopes (erased_at);
