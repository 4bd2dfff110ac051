-- Demo: a queued turn's outcome.
SELECT state::text AS state, reply, error FROM turns WHERE id = $1
