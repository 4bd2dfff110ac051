-- Whether the database has kvmem's turns table at all (a fresh one does not): read before
-- counting, since a statement naming a missing table does not parse.
SELECT to_regclass('turns') IS NOT NULL
