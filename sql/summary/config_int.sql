-- An integer tunable from kvmem_config ($1 key, $2 default).
SELECT coalesce((SELECT value::integer FROM kvmem_config WHERE key = $1), $2::integer)
