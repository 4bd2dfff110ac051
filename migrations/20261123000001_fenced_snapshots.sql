-- Fenced snapshots and per-user idempotency keys.

-- The fencing token of the attempt whose completion committed. A snapshot carries the token
-- of the attempt that wrote it, and is trusted only when (turn_id, token) match this row: a
-- worker paused past its lease can still rename its file into place, but never make it
-- look like the committed one.
ALTER TABLE turns ADD COLUMN done_token bigint;

-- An idempotency key belongs to one user. Keys of different users never meet, so one user
-- can neither read another's turn through a key nor learn that the key was used.
DROP INDEX turns_idempotency_key;
CREATE UNIQUE INDEX turns_idempotency_key ON turns (user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
