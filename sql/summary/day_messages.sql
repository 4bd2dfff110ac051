-- One scope's messages in [$2, $3), oldest first, at most $4 (autocommit read). Scope is
-- the guild ('' = direct chats); turn messages name their user and character.
SELECT user_id, character_id, speaker, text, at
  FROM memory_messages
 WHERE coalesce(guild_id, '') = $1 AND at >= $2 AND at < $3
 ORDER BY at, id
 LIMIT $4
