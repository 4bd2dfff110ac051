-- A retried chat request is the same turn (issue 58). The chat endpoint stores a hash of
-- each request it queues without an Idempotency-Key (user, session, character and body),
-- so that a retry of it maps to the turn the first attempt queued; and when it handed the
-- turn's answer (its reply, or the error it ended with) to a client, after which an
-- identical request without a retry header is a new turn. Both null for turns queued
-- otherwise. Additive: nullable columns, which a worker of the previous release ignores.
ALTER TABLE turns ADD COLUMN request_hash text;
ALTER TABLE turns ADD COLUMN delivered_at timestamptz;
