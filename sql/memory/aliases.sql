-- Entity aliases of one user (autocommit read).
SELECT alias_ref, canonical_ref FROM memory_entity_aliases WHERE user_id = $1
