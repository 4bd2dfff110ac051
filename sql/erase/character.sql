-- Erases one character everywhere in Postgres (sql/api/erase.sql; one transaction).
-- $1 character id.
SELECT kvmem_erase_character($1)
