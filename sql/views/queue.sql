-- Monitoring views for ops. Re-created by `kvmem migrate`; all read-only.
DROP VIEW IF EXISTS kvmem_queue_stats, kvmem_oldest_queued, kvmem_running, kvmem_stuck,
    kvmem_dead, kvmem_session_backlog, kvmem_throughput, kvmem_latency, kvmem_warm_ratio;

-- Queue depth by state and lane (every state and lane appears, with 0 when empty).
CREATE VIEW kvmem_queue_stats AS
SELECT s.state, l.lane, count(t.id)::bigint AS turns
  FROM unnest(enum_range(NULL::turn_state)) AS s(state)
 CROSS JOIN (VALUES ('live'), ('replay')) AS l(lane)
  LEFT JOIN turns t ON t.state = s.state AND t.lane = l.lane
 GROUP BY s.state, l.lane
 ORDER BY s.state, l.lane;

-- How long the oldest waiting turn has waited, per lane.
CREATE VIEW kvmem_oldest_queued AS
SELECT lane, min(created_at) AS oldest_created_at,
       extract(epoch FROM now() - min(created_at))::float8 AS age_s,
       count(*)::bigint AS queued
  FROM turns WHERE state = 'queued'
 GROUP BY lane;

-- Turns running now, with how long their lease has been held and how long it has left.
CREATE VIEW kvmem_running AS
SELECT t.id AS turn_id, t.session_id, l.owner, l.fencing_token, t.attempts,
       extract(epoch FROM now() - l.acquired_at)::float8 AS lease_age_s,
       extract(epoch FROM now() - l.heartbeat_at)::float8 AS since_heartbeat_s,
       extract(epoch FROM l.expires_at - now())::float8 AS expires_in_s
  FROM turns t
  JOIN session_locks l ON l.session_id = t.session_id AND l.turn_id = t.id
 WHERE t.state = 'running';

-- Running turns whose lease expired: their worker died. The reaper will requeue them.
CREATE VIEW kvmem_stuck AS
SELECT * FROM kvmem_running WHERE expires_in_s <= 0;

-- Turns that ran out of attempts, with the error they died of.
CREATE VIEW kvmem_dead AS
SELECT id AS turn_id, session_id, user_id, attempts, error, created_at, finished_at
  FROM turns WHERE state = 'dead'
 ORDER BY id DESC;

-- Pending turns per session: a long backlog means a slow or stuck session.
CREATE VIEW kvmem_session_backlog AS
SELECT session_id, count(*)::bigint AS pending,
       min(created_at) AS oldest_created_at,
       bool_or(state = 'running') AS running
  FROM turns WHERE state IN ('queued', 'running')
 GROUP BY session_id
 ORDER BY pending DESC, session_id;

-- Finished turns per minute over the last hour.
CREATE VIEW kvmem_throughput AS
SELECT date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE state = 'done')::bigint AS done,
       count(*) FILTER (WHERE state IN ('failed', 'dead'))::bigint AS failed
  FROM turns
 WHERE finished_at > now() - interval '1 hour'
 GROUP BY 1 ORDER BY 1;

-- Turn latency percentiles over the last hour of successful attempts.
CREATE VIEW kvmem_latency AS
SELECT count(*)::bigint AS turns,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms)::float8 AS p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms)::float8 AS p95_ms
  FROM turn_log
 WHERE status = 'OK' AND finished_at > now() - interval '1 hour';

-- Share of warm (snapshot-resumed) turns over the last hour.
CREATE VIEW kvmem_warm_ratio AS
SELECT count(*) FILTER (WHERE NOT cold)::bigint AS warm,
       count(*) FILTER (WHERE cold)::bigint AS cold,
       CASE WHEN count(*) = 0 THEN NULL
            ELSE (count(*) FILTER (WHERE NOT cold))::float8 / count(*) END AS warm_ratio
  FROM turn_log
 WHERE status = 'OK' AND finished_at > now() - interval '1 hour';
