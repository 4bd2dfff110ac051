-- A turn's state, for the chat endpoint's wait loop.
SELECT state::text FROM turns WHERE id = $1
