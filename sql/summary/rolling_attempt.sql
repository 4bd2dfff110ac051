-- Seed 001's rolling diagnostics: an attempt started (autocommit).
UPDATE session_state SET last_rolling_attempt_at = $3, updated_at = now()
 WHERE user_id = $1 AND character_id = $2
