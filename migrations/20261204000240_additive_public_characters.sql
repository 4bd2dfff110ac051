-- Characters everyone can talk to (docs/http-api.md#characters-are-models): a public
-- character is set up once and played by many users, each with their own sessions,
-- memories, summaries, todos and digests of it, all of which are keyed by (user, character)
-- already. Its row's user_id is who set it up (an operator's name for `kvmem character
-- add --public`). Existing characters stay owned. Additive: a nullable-free column with a
-- default, which a worker of the previous release never reads (it lets only the owner
-- talk to a character, as before).
ALTER TABLE user_characters ADD COLUMN public boolean NOT NULL DEFAULT false;
CREATE INDEX user_characters_public_idx ON user_characters (id) WHERE public;
