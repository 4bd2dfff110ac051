-- The stored parts of a turn's context block ($1 user, $2 character): the newest valid
-- session summary and the spine (seed 001, per user and character), and seed 004's newest
-- merged user context for direct chats (scope ''). Both keys filter: another user's
-- character id finds nothing.
SELECT sc.latest_session_summary, uc.context AS user_context, sc.spine
  FROM (SELECT $1::text AS user_id) u
  LEFT JOIN kvmem_session_context sc ON sc.user_id = u.user_id AND sc.character_id = $2
  LEFT JOIN LATERAL (
        SELECT context FROM user_contexts
         WHERE scope = '' AND user_id = u.user_id
         ORDER BY created_at DESC LIMIT 1) uc ON true
