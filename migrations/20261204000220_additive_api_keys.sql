-- Per-user API keys (`http.identity = "key"`, docs/http-api.md#identity): a bearer key is its
-- user's identity on every route. Only the SHA-256 of a key is kept: a key is 32 random
-- bytes, so a plain hash cannot be reversed by guessing, and a stolen table grants nothing.
-- `prefix` (the key's first characters) lets `kvmem keys list` and an operator tell keys
-- apart. Revoked keys stay, marked, so a revocation is visible; a user's erase removes
-- them all. Additive: a worker of the previous release never reads this table.
CREATE TABLE api_keys (
    id         bigserial   PRIMARY KEY,
    user_id    text        NOT NULL,
    label      text        NOT NULL DEFAULT '',
    prefix     text        NOT NULL,
    key_sha256 bytea       NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX api_keys_user_idx ON api_keys (user_id);
