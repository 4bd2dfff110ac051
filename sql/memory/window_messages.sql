-- One user's messages inside a time window the query named (autocommit read); bounded,
-- newest first.
SELECT id
  FROM memory_messages
 WHERE user_id = $1
   AND ($2::bigint IS NULL OR character_id = $2 OR character_id IS NULL)
   AND guild_id IS NOT DISTINCT FROM $3
   AND ($4::timestamptz IS NULL OR at <= $4)
   AND at >= $5 AND at < $6
 ORDER BY at DESC, id DESC
 LIMIT 500
