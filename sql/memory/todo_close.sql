-- Closes one open todo of the user ($2) with the character ($3): status $4 ('done' or
-- 'dropped'), the closing message's id ($5) and words ($6) as provenance, at $7. Both
-- owner keys filter, so an id of another user's todo closes nothing.
UPDATE todos
   SET status = $4, closed_by_message_id = $5, closed_evidence = $6,
       closed_at = $7, updated_at = now()
 WHERE id = $1 AND user_id = $2 AND character_id = $3 AND status = 'open'
RETURNING id
