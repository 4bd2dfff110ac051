-- What the user said in session $2 before turn $3's message (newest first, at most $4),
-- for "remember this about X". Only the user's own messages: the character's replies are
-- no evidence about a person. Both user and session filter.
SELECT message_id, text
  FROM memory_messages
 WHERE user_id = $1 AND session_id = $2 AND speaker <> 'assistant'
   AND message_id <> 'turn:' || $3 || ':user'
   AND at <= coalesce((SELECT at FROM memory_messages
                        WHERE user_id = $1 AND message_id = 'turn:' || $3 || ':user'), now())
 ORDER BY at DESC, id DESC
 LIMIT $4
