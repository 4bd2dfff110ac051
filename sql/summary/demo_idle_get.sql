-- Demo (memory scene): the session idle timeout before the scene shortens it.
SELECT value FROM kvmem_config WHERE key = 'summary_session_idle_s'
