-- The user message and the stored reply of the turn whose assistant message id is $2
-- ('turn:<id>:assistant'), for grounding that turn's memory line. The user filter keeps
-- the wall.
SELECT string_agg(text, E'\n' ORDER BY id)
  FROM memory_messages
 WHERE user_id = $1
   AND message_id IN ($2, regexp_replace($2, ':assistant$', ':user'))
