-- A stored merged user context, by the content hashes of its inputs.
SELECT context FROM user_contexts
 WHERE scope = $1 AND user_id = $2 AND facts_hash = $3 AND current_hash = $4 AND historical_hash = $5
