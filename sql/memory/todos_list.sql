-- The todos of one user ($1) with one character ($2); open ones only when $3. Open todos
-- come first, those due soonest first; closed ones after, newest first.
SELECT id, user_id, character_id, kind, text, status, due_date, source_message_ids,
       closed_by_message_id, closed_evidence, created_at, closed_at
  FROM todos
 WHERE user_id = $1 AND character_id = $2 AND (NOT $3 OR status = 'open')
 ORDER BY status <> 'open', due_date NULLS LAST, created_at DESC, id DESC
