-- Issue 60: a chat request's sampling fields (temperature, top_p, seed, stop, max_tokens)
-- travel on its turn, because the turn is queued here and run later by whichever worker
-- claims it. Null: the worker's configured sampling, as before. kvmem_enqueue_turn
-- validates the object, so a worker only ever reads the shape it documents. Additive: a
-- worker of the previous release inserts and claims turns without it (and samples as
-- configured).
ALTER TABLE turns ADD COLUMN options jsonb;
