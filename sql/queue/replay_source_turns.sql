-- Replay: the source session's completed turns, in order, with how each one's KV started
-- (the committing attempt's log row), so a divergence can be traced to a cold start.
SELECT t.user_id, t.character_id, t.message, t.reply, l.cold, l.cold_reason, l.rebuild
  FROM turns t
  LEFT JOIN LATERAL (SELECT cold, cold_reason, rebuild FROM turn_log
                      WHERE turn_id = t.id AND status = 'OK' ORDER BY id DESC LIMIT 1) l ON true
 WHERE t.session_id = $1 AND t.state = 'done'
 ORDER BY t.id
