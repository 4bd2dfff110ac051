-- The stored parts of a turn's context block ($1 user, $2 character): the newest valid
-- session summary and the spine (seed 001, per user and character), seed 004's newest
-- merged user context for direct chats (scope ''), and seed 001's open todos with this
-- character (persona-scoped: another character's todos never match $2). Both keys
-- filter: another user's character id finds nothing.
SELECT sc.latest_session_summary, uc.context AS user_context, sc.spine, td.todos
  FROM (SELECT $1::text AS user_id) u
  LEFT JOIN kvmem_session_context sc ON sc.user_id = u.user_id AND sc.character_id = $2
  LEFT JOIN LATERAL (
        SELECT context FROM user_contexts
         WHERE scope = '' AND user_id = u.user_id
         ORDER BY created_at DESC LIMIT 1) uc ON true
  LEFT JOIN LATERAL (
        SELECT string_agg(t.text || coalesce(' (due ' || t.due_date || ')', ''), '; '
                          ORDER BY t.due_date NULLS LAST, t.created_at, t.id) AS todos
          FROM (SELECT text, due_date, created_at, id FROM todos
                 WHERE user_id = u.user_id AND character_id = $2 AND status = 'open'
                 ORDER BY due_date NULLS LAST, created_at, id
                 LIMIT 8) t) td ON true
