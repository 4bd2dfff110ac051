-- Queues a forget through the SQL API, as a backend would (autocommit).
SELECT kvmem_forget($1, $2, $3, $4)
