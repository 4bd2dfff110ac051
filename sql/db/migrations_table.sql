-- Whether sqlx's bookkeeping table exists: a database no `kvmem migrate` has touched lacks it.
SELECT to_regclass('_sqlx_migrations') IS NOT NULL
