-- Erases one user's part of a character (a public one): their sessions with it and what
-- came of them (sql/api/erase.sql; one transaction). $1 user, $2 character id.
SELECT kvmem_erase_user_character($1, $2)
