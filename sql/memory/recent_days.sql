-- Message counts per day over the user's last 7 active days, for MEMORY.md (autocommit read).
SELECT date_trunc('day', at AT TIME ZONE 'UTC')::date AS day, count(*)::bigint AS n
  FROM memory_messages
 WHERE user_id = $1 AND guild_id IS NOT DISTINCT FROM $2
 GROUP BY 1 ORDER BY 1 DESC LIMIT 7
