-- Queues a remember through the SQL API, as a backend would (autocommit).
SELECT kvmem_remember($1, $2, $3, $4, $5)
