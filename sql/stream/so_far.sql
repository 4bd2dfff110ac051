-- What a turn has streamed so far (sql/api/stream.sql): the late reader's function, as the
-- HTTP relay calls it after its LISTEN. $1 turn id.
SELECT state, attempt, seq, text, done, meta FROM kvmem_turn_stream($1)
