-- The messages just before and after each of one user's candidates in its own session
-- (autocommit read; nothing after the $3 as-of cut): a turn's meaning often sits in the turns around it.
SELECT c.id,
       (SELECT p.id FROM memory_messages p
         WHERE p.user_id = c.user_id AND p.session_id = c.session_id
           AND (p.at, p.id) < (c.at, c.id)
         ORDER BY p.at DESC, p.id DESC LIMIT 1) AS prev,
       (SELECT n.id FROM memory_messages n
         WHERE n.user_id = c.user_id AND n.session_id = c.session_id
           AND (n.at, n.id) > (c.at, c.id)
           AND ($3::timestamptz IS NULL OR n.at <= $3)
         ORDER BY n.at, n.id LIMIT 1) AS next
  FROM memory_messages c
 WHERE c.user_id = $1 AND c.id = ANY($2::bigint[])
