-- Summary views (issue 14), re-created by `kvmem migrate`. Read-only.

-- Seed 001's SessionState document per user and character.
CREATE OR REPLACE VIEW kvmem_session_state AS
SELECT user_id, character_id,
       jsonb_build_object(
           'messageCount', message_count,
           'lastInteraction', last_interaction,
           'lastUserMessage', last_user_message,
           'curator', jsonb_build_object('lastRunAt', curator_last_run_at,
                                         'lastMemoryCountAtRun', curator_last_memory_count),
           'lastRollingAttemptAt', last_rolling_attempt_at,
           'lastRollingSuccessAt', last_rolling_success_at,
           'lastRollingError', last_rolling_error) AS state,
       rolling_summary AS "rollingSummary"
  FROM session_state;

-- The latest rolling summary per user and character, with how many versions came before.
CREATE OR REPLACE VIEW kvmem_rolling_summary AS
SELECT DISTINCT ON (user_id, character_id)
       user_id, character_id, id, content, message_count, created_at,
       count(*) OVER (PARTITION BY user_id, character_id) AS versions
  FROM rolling_summaries
 ORDER BY user_id, character_id, id DESC;

-- Session summaries with their session's span (errors included, with the error).
CREATE OR REPLACE VIEW kvmem_session_summaries AS
SELECT ss.id, ss.session_id, ss.user_id, ss.character_id, s.started_at, s.ended_at,
       s.turn_count, ss.status, ss.summary, ss.error, ss.attempts, ss.created_at
  FROM session_summaries ss
  JOIN summary_sessions s ON s.id = ss.session_id;

-- The current spine version per user.
CREATE OR REPLACE VIEW kvmem_spine AS
SELECT DISTINCT ON (user_id) user_id, version, content, sections, message_count, created_at
  FROM summary_spine
 ORDER BY user_id, version DESC;

-- The latest merged user context per scope and user.
CREATE OR REPLACE VIEW kvmem_user_context AS
SELECT DISTINCT ON (scope, user_id) scope, user_id, context, created_at
  FROM user_contexts
 ORDER BY scope, user_id, created_at DESC;

-- The summary lane: jobs by kind and state.
CREATE OR REPLACE VIEW kvmem_summary_lane AS
SELECT kind, state, count(*) AS jobs, min(run_at) FILTER (WHERE state = 'queued') AS next_due
  FROM summary_jobs
 GROUP BY kind, state;

-- What a new session of a user and character starts from (seed 001's timeline: "Context
-- includes: latest SessionSummary, rollingSummary"), plus the user's current spine.
CREATE OR REPLACE VIEW kvmem_session_context AS
SELECT st.user_id, st.character_id, st.rolling_summary,
       ls.session_id AS latest_session_id, ls.ended_at AS latest_session_ended_at,
       ls.summary AS latest_session_summary,
       sp.version AS spine_version, sp.content AS spine,
       os.id AS open_session_id, os.started_at AS open_session_started_at
  FROM session_state st
  LEFT JOIN LATERAL (
       SELECT ss.session_id, s.ended_at, ss.summary
         FROM session_summaries ss
         JOIN summary_sessions s ON s.id = ss.session_id
        WHERE ss.user_id = st.user_id AND ss.character_id = st.character_id
          AND ss.status = 'ok'
        ORDER BY ss.id DESC
        LIMIT 1) ls ON true
  LEFT JOIN kvmem_spine sp ON sp.user_id = st.user_id
  LEFT JOIN summary_sessions os
         ON os.user_id = st.user_id AND os.character_id = st.character_id AND os.ended_at IS NULL;
