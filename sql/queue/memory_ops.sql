-- The memory work a committed turn ($2) asked for, queued on the memory lane inside the
-- completion: a reply that acknowledges it is committed with it, or neither is. $1 is a
-- JSON array of {turn_id, kind, text}: in-chat "remember that …" / "forget that …",
-- "remember this about X" (text = the name) and the reply's own memory line. The user,
-- character and session come from the turn row, never from the caller. The texts were
-- checked before (lengths), so the API functions cannot fail the batch.
SELECT CASE o.kind
         WHEN 'remember' THEN kvmem_remember_from(t.user_id, t.character_id, o.text,
                                                  'turn:' || t.id || ':user')
         WHEN 'forget' THEN kvmem_forget(t.user_id, t.character_id, o.text)
         WHEN 'about' THEN kvmem_remember_about(t.user_id, t.character_id, o.text,
                                                t.session_id, t.id)
         WHEN 'line' THEN kvmem_remember_line(t.user_id, t.character_id, o.text,
                                              'turn:' || t.id || ':assistant')
       END AS job_id
  FROM jsonb_to_recordset($1) AS o(turn_id bigint, kind text, text text)
  JOIN turns t ON t.id = o.turn_id
 WHERE o.turn_id = ANY($2)
 ORDER BY o.turn_id
