-- Demo (memory scene): the summary layer's events for the user, in order.
SELECT created_at, kind, detail FROM events
 WHERE kind LIKE 'summary\_%' AND detail->>'user_id' = $1
 ORDER BY id
