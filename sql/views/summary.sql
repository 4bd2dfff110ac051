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
