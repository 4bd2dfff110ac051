-- Seed 001's rolling diagnostics: the attempt failed, with a reason (autocommit).
UPDATE session_state SET last_rolling_error = $3, updated_at = now()
 WHERE user_id = $1 AND character_id = $2
