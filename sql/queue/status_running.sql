-- Status: running turns and their leases.
SELECT turn_id, session_id, owner, lease_age_s, expires_in_s FROM kvmem_running ORDER BY turn_id LIMIT 50
