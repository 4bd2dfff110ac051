-- One user's messages of one UTC day, for the journal (autocommit read).
SELECT at, speaker, text, session_id FROM memory_messages
 WHERE user_id = $1 AND guild_id IS NOT DISTINCT FROM $2
   AND at >= $3 AND at < $3 + interval '1 day'
 ORDER BY at, id
