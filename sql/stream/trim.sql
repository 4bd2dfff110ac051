-- The reaper's sweep of old deltas: a finished turn's reply is in turns.reply, and a
-- running turn's newest delta is seconds old. $1 retention in seconds; a bounded batch.
DELETE FROM turn_stream_deltas
 WHERE ctid = ANY (ARRAY(
     SELECT ctid FROM turn_stream_deltas
      WHERE created_at < now() - make_interval(secs => $1)
      LIMIT 10000))
