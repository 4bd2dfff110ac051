-- A chat session's compaction boundary and summary.
SELECT boundary_message_id, long_term_summary FROM session_compactions WHERE session_id = $1
