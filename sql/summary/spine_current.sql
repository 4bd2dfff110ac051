-- The user's current spine version.
SELECT version, content, message_count, created_at FROM kvmem_spine WHERE user_id = $1
