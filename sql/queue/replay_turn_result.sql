-- Replay: a replayed turn's outcome with its latest successful log row.
SELECT t.state::text AS state, t.reply, l.latency_ms, l.cold, l.cold_reason, l.rebuild
  FROM turns t
  LEFT JOIN LATERAL (SELECT latency_ms, cold, cold_reason, rebuild FROM turn_log
                      WHERE turn_id = t.id AND status = 'OK' ORDER BY id DESC LIMIT 1) l ON true
 WHERE t.id = $1
