-- Erases one user everywhere in Postgres (sql/api/erase.sql; one transaction). $1 user id.
SELECT kvmem_erase_user($1)
