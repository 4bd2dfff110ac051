-- In-chat "remember that …" / "forget that …" of the committed turns ($2), queued on the
-- memory lane inside the completion: a reply that acknowledges one is committed with it,
-- or neither is. $1 is a JSON array of {turn_id, kind, text}; the user and character come
-- from the turn row, never from the caller. The texts were checked before (3 to 2000
-- characters), so kvmem_memory_check cannot fail the batch.
SELECT CASE o.kind
         WHEN 'remember' THEN kvmem_remember(t.user_id, t.character_id, o.text)
         ELSE kvmem_forget(t.user_id, t.character_id, o.text)
       END AS job_id
  FROM jsonb_to_recordset($1) AS o(turn_id bigint, kind text, text text)
  JOIN turns t ON t.id = o.turn_id
 WHERE o.turn_id = ANY($2)
 ORDER BY o.turn_id
