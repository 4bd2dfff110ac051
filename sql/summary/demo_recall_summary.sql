-- Demo (recall scene): the user's newest session summary.
SELECT status, summary FROM session_summaries WHERE user_id = $1 ORDER BY id DESC LIMIT 1
