-- Take each session's rebuild lock, so a rebuild that read older facts never stores its
-- digest over a newer one. $1 session ids, sorted: two batches lock in the same order and
-- never deadlock. The transaction also commits without waiting for the WAL flush: a
-- digest is derived from committed facts, and a crash that loses it loses the claimed
-- markers' deletion with it, so the session is rebuilt again.
SELECT set_config('synchronous_commit', 'off', true),
       pg_advisory_xact_lock(hashtextextended('kvmem:digest:' || s, 0))
  FROM unnest($1::text[]) s
