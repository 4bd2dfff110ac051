-- One batch's messages in [$2, $3), oldest first, at most $4 (autocommit read). $1 is the
-- guild ('' = direct chats); direct chats are read for one user ($5) only, so a private
-- conversation never enters another user's summary. Turn messages name their character.
SELECT user_id, character_id, speaker, text, at
  FROM memory_messages
 WHERE coalesce(guild_id, '') = $1
   AND ($1 <> '' OR user_id = $5)
   AND at >= $2 AND at < $3
 ORDER BY at, id
 LIMIT $4
