-- Records a todo of the user ($1) made to the character ($2): kind $3, text $4, key $5,
-- due date $6, from message $7 at $8. The same todo said again while open is one row: it
-- gains the message as a source and keeps the first due date unless it had none.
INSERT INTO todos (user_id, character_id, kind, text, todo_key, due_date, source_message_ids,
                   created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, ARRAY[$7], $8, now())
ON CONFLICT (user_id, character_id, todo_key) WHERE status = 'open' DO UPDATE
   SET source_message_ids = CASE WHEN $7 = ANY (todos.source_message_ids)
                                 THEN todos.source_message_ids
                                 ELSE todos.source_message_ids || $7 END,
       due_date = coalesce(todos.due_date, EXCLUDED.due_date),
       updated_at = now()
RETURNING id
