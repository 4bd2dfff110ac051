-- `kvmem summary show`: one row per character of the user ($1 user, $2 character or NULL).
SELECT st.character_id, to_jsonb(v.state) AS state, st.rolling_summary,
       (SELECT count(*) FROM rolling_summaries r
         WHERE r.user_id = st.user_id AND r.character_id = st.character_id) AS rolling_versions,
       (SELECT jsonb_agg(x ORDER BY x.id DESC) FROM (
            SELECT ss.id, ss.session_id, ss.status, ss.summary, ss.error, ss.attempts
              FROM session_summaries ss
             WHERE ss.user_id = st.user_id AND ss.character_id = st.character_id
             ORDER BY ss.id DESC LIMIT 5) x) AS sessions,
       (SELECT to_jsonb(s) FROM summary_sessions s
         WHERE s.user_id = st.user_id AND s.character_id = st.character_id AND s.ended_at IS NULL) AS open_session
  FROM session_state st
  JOIN kvmem_session_state v ON v.user_id = st.user_id AND v.character_id = st.character_id
 WHERE st.user_id = $1 AND ($2::bigint IS NULL OR st.character_id = $2)
 ORDER BY st.character_id
