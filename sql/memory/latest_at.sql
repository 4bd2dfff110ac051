-- The newest message time of one user, the reference for relative time phrases when no
-- --as-of is given (autocommit read). A backward walk of (user_id, at) that stops at the
-- first row of the guild. Spelled so the planner sees it: with `max(at)`, or with the
-- guild as `IS NOT DISTINCT FROM`, it read every message of the user (131 ms at 100,000).
SELECT at FROM memory_messages
 WHERE user_id = $1
   AND (guild_id = $2 OR (guild_id IS NULL AND $2::text IS NULL))
   AND at <= coalesce($3::timestamptz, 'infinity')
 ORDER BY user_id DESC, at DESC
 LIMIT 1
