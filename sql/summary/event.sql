-- A summary job's progress or failure, for `kvmem status` (autocommit; no transaction).
INSERT INTO events (kind, detail) VALUES ($1, $2)
