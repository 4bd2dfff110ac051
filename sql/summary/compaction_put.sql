-- Moves a chat session's compaction boundary (autocommit). `messages` is untouched.
INSERT INTO session_compactions (session_id, boundary_message_id, long_term_summary, compacted_entries)
VALUES ($1, $2, $3, $4)
ON CONFLICT (session_id) DO UPDATE
   SET boundary_message_id = EXCLUDED.boundary_message_id,
       long_term_summary = EXCLUDED.long_term_summary,
       compacted_entries = session_compactions.compacted_entries + EXCLUDED.compacted_entries,
       updated_at = now()
