-- The latest summary failures and degradations, newest first.
SELECT kind, detail, created_at FROM events
 WHERE kind IN ('summary_job_failed', 'summary_context_degraded', 'summary_model_unavailable')
 ORDER BY id DESC LIMIT $1
