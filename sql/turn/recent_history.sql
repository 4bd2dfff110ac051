-- A cold start's dialogue: the session's last $2 exchanges, oldest first.
SELECT u.content AS user_text, a.content AS reply_text
  FROM (SELECT turn_id, content FROM messages
         WHERE session_id = $1 AND role = 'user'
         ORDER BY turn_id DESC LIMIT $2) u
  JOIN messages a ON a.turn_id = u.turn_id AND a.role = 'assistant'
 ORDER BY u.turn_id
