-- A lane job whose row was erased while it ran: erase again what it wrote, if its user or
-- character was erased in the last $3 seconds (sql/api/erase.sql). $1 user, $2 character.
SELECT kvmem_erase_late($1, $2, $3)
