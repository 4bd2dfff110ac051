-- The new rolling summary becomes current (inside the rolling transaction).
UPDATE session_state
   SET rolling_summary = $3, rolling_last_message_id = $4, last_rolling_success_at = $5,
       last_rolling_error = NULL, updated_at = now()
 WHERE user_id = $1 AND character_id = $2
