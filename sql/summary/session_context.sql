-- A user and character's session context ($1 user, $2 character): both keys filter, so
-- naming another user's character finds nothing (autocommit read).
SELECT rolling_summary, latest_session_id, latest_session_ended_at, latest_session_summary,
       spine_version, spine, open_session_id, open_session_started_at
  FROM kvmem_session_context
 WHERE user_id = $1 AND character_id = $2
