-- Demo (memory scene): sets the session idle timeout (seconds); restored at the end.
INSERT INTO kvmem_config (key, value) VALUES ('summary_session_idle_s', $1)
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value
