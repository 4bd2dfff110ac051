-- One summary session.
SELECT id, user_id, character_id, started_at, last_activity_at, ended_at, turn_count,
       first_message_id, last_message_id
  FROM summary_sessions WHERE id = $1
