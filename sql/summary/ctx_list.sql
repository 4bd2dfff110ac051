-- Every stored context's session id.
SELECT session_id FROM contexts ORDER BY session_id
