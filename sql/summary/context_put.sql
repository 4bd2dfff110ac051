-- Stores a merged user context (autocommit).
INSERT INTO user_contexts (scope, user_id, facts_hash, current_hash, historical_hash, context, degraded)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (scope, user_id, facts_hash, current_hash, historical_hash) DO NOTHING
