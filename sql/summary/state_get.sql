-- A user and character's session state.
SELECT message_count, rolling_summary, rolling_last_message_id
  FROM session_state WHERE user_id = $1 AND character_id = $2
