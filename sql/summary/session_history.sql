-- A chat session's dialogue after the compaction boundary ($2), oldest first.
SELECT id, role, content, created_at FROM messages
 WHERE session_id = $1 AND id > $2
 ORDER BY id
