-- Erases one session everywhere in Postgres (sql/api/erase.sql; one transaction).
-- $1 session id, $2 the user whose part it is (NULL: every user's).
SELECT kvmem_erase_session($1, $2)
