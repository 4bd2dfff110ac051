-- Status: dead-lettered turns.
SELECT turn_id, session_id, attempts, error FROM kvmem_dead LIMIT 20
