-- A cold start's dialogue: the session's last $2 exchanges, oldest first. Past a
-- compaction (issue 14) only the exchanges after its boundary are re-read, behind one recap
-- exchange carrying the summary of what lies before it; `messages` itself is untouched.
WITH c AS (
    SELECT boundary_message_id, long_term_summary FROM session_compactions WHERE session_id = $1
)
SELECT turn_id, user_text, reply_text FROM (
    SELECT 0 AS part, 0::bigint AS turn_id,
           'Remind me what we talked about earlier.' AS user_text,
           'Earlier in this conversation: ' || c.long_term_summary AS reply_text
      FROM c
    UNION ALL
    SELECT 1, u.turn_id, u.content, a.content
      FROM (SELECT id, turn_id, content FROM messages
             WHERE session_id = $1 AND role = 'user'
               AND id > coalesce((SELECT boundary_message_id FROM c), 0)
             ORDER BY turn_id DESC LIMIT $2) u
      JOIN messages a ON a.turn_id = u.turn_id AND a.role = 'assistant'
) h
 ORDER BY part, turn_id
