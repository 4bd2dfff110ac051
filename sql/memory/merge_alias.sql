-- Records that alias_ref means canonical_ref for one user (autocommit; idempotent).
INSERT INTO memory_entity_aliases (user_id, alias_ref, canonical_ref, similarity)
VALUES ($1, $2, $3, $4)
ON CONFLICT (user_id, alias_ref) DO UPDATE SET canonical_ref = EXCLUDED.canonical_ref,
    similarity = EXCLUDED.similarity
