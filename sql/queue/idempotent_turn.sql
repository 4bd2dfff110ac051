-- The turn a user's idempotency key already queued, and its session (keys are per user).
-- $1 user, $2 key.
SELECT id, session_id FROM turns WHERE user_id = $1 AND idempotency_key = $2
