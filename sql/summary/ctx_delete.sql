-- Deletes a context document.
DELETE FROM contexts WHERE session_id = $1
