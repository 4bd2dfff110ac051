-- A memory-layer failure or degradation, for ops (autocommit; no transaction).
INSERT INTO events (kind, detail) VALUES ($1, $2)
