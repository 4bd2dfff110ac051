-- A context document, as the text that was saved.
SELECT data::text FROM contexts WHERE session_id = $1
