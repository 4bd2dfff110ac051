-- `kvmem summary rebuild`: queue a rolling summary per character, a session summary per
-- closed session and a spine for the user ($1 user, $2 character or NULL), due now.
WITH r AS (
    INSERT INTO summary_jobs (kind, user_id, character_id, payload)
    SELECT 'rolling', st.user_id, st.character_id, jsonb_build_object('rebuild', true)
      FROM session_state st
     WHERE st.user_id = $1 AND ($2::bigint IS NULL OR st.character_id = $2)
    ON CONFLICT (user_id, character_id) WHERE kind = 'rolling' AND state = 'queued' DO NOTHING
    RETURNING 1
), s AS (
    INSERT INTO summary_jobs (kind, user_id, character_id, session_id)
    SELECT 'session', ss.user_id, ss.character_id, ss.id
      FROM summary_sessions ss
     WHERE ss.user_id = $1 AND ($2::bigint IS NULL OR ss.character_id = $2) AND ss.ended_at IS NOT NULL
    ON CONFLICT (session_id) WHERE kind = 'session' AND state = 'queued' DO NOTHING
    RETURNING 1
), p AS (
    INSERT INTO summary_jobs (kind, user_id, payload)
    VALUES ('spine', $1, jsonb_build_object('rebuild', true))
    ON CONFLICT (user_id) WHERE kind = 'spine' AND state = 'queued' DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM r) + (SELECT count(*) FROM s) + (SELECT count(*) FROM p) AS queued
