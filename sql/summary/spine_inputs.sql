-- What a new spine version is made from: the user's message total, the latest spine, and
-- the session summaries made since it ($1 = user).
SELECT (SELECT coalesce(sum(message_count), 0)::integer FROM session_state WHERE user_id = $1) AS total,
       sp.version, sp.content, sp.message_total_at,
       coalesce((SELECT jsonb_agg(ss.summary ORDER BY ss.id)
                   FROM session_summaries ss
                  WHERE ss.user_id = $1 AND ss.status = 'ok'
                    AND ss.created_at > coalesce(sp.created_at, '-infinity')), '[]'::jsonb) AS sessions,
       coalesce((SELECT jsonb_agg(st.rolling_summary ORDER BY st.character_id)
                   FROM session_state st
                  WHERE st.user_id = $1 AND st.rolling_summary <> ''), '[]'::jsonb) AS rolling
  FROM (SELECT 1) one
  LEFT JOIN LATERAL (SELECT version, content, message_total_at, created_at
                       FROM summary_spine WHERE user_id = $1
                      ORDER BY version DESC LIMIT 1) sp ON true
