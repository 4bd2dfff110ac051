-- Demo (memory scene): a closed session's summary (or the error stored instead).
SELECT status, summary, error, attempts, elapsed_ms FROM session_summaries
 WHERE session_id = $1 ORDER BY id DESC LIMIT 1
