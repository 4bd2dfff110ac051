-- One exceptional event of a turn (cold start, quarantined snapshot), for ops.
INSERT INTO events (session_id, turn_id, kind, detail) VALUES ($1, $2, $3, $4)
