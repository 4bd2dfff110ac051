-- Replay: how many of the replayed turns have finished.
SELECT count(*) FROM turns WHERE id = ANY($1) AND state IN ('done', 'failed', 'dead')
