-- Erasure that leaves nothing, and says so without naming whom (docs/security.md):
-- * `kvmem_secrets` holds a random key made here, on the first migrate, that never leaves
--   the database. The erase audit event names its subject by HMAC-SHA-256 under it, so a
--   guessable id (an email, a number) cannot be confirmed by hashing guesses without it.
-- * `turns_copied_from_idx` finds the sessions branched from a session (a regenerate, an
--   edit), which a session's erase takes with it.
-- Additive: an extension, a table, one row and an index, none of which an older worker reads.
CREATE EXTENSION IF NOT EXISTS pgcrypto;
CREATE TABLE kvmem_secrets (
    name       text        PRIMARY KEY,
    secret     bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO kvmem_secrets (name, secret) VALUES ('erase_audit', gen_random_bytes(32));
CREATE INDEX turns_copied_from_idx ON turns (copied_from) WHERE copied_from IS NOT NULL;
