-- Closes the session ($1) if it has been idle long enough at $2 (now), and returns its
-- idle deadline either way, so a job that ran early can wait for it (autocommit).
SELECT kvmem_summary_close(s.id, $2, 'idle') AS closed,
       s.ended_at IS NOT NULL AS already_closed,
       s.last_activity_at + make_interval(secs => coalesce(
           (SELECT value::integer FROM kvmem_config WHERE key = 'summary_session_idle_s'), 1800)) AS due_at
  FROM summary_sessions s
 WHERE s.id = $1
