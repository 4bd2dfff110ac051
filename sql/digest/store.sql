-- Store rebuilt digests and record a `digest_rebuilt` event for each row written. A row
-- changes only when its version (or the next expiry that will change it) does, so an
-- unchanged digest costs no write. Rows and events are stamped when written, not when the
-- transaction began: it may have waited for a session's rebuild lock.
-- $1 sessions, $2 versions, $3 contents, $4 tokens, $5 fact counts, $6 next expiries.
WITH stored AS (
    INSERT INTO state_digest AS d
           (session_id, digest_version, digest_content, digest_tokens, fact_count, next_expiry_at, updated_at)
    SELECT s, v, c, t, f, e, clock_timestamp()
      FROM unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::int4[], $6::timestamptz[])
           AS u(s, v, c, t, f, e)
     -- Not for a session that has nothing (erased, sql/api/erase.sql, which holds the
     -- session's rebuild lock while it deletes): no facts, no turns, no digest yet.
     WHERE EXISTS (SELECT 1 FROM facts WHERE session_id = u.s)
        OR EXISTS (SELECT 1 FROM turns WHERE session_id = u.s)
        OR EXISTS (SELECT 1 FROM state_digest WHERE session_id = u.s)
    ON CONFLICT (session_id) DO UPDATE
       SET digest_version = EXCLUDED.digest_version,
           digest_content = EXCLUDED.digest_content,
           digest_tokens  = EXCLUDED.digest_tokens,
           fact_count     = EXCLUDED.fact_count,
           next_expiry_at = EXCLUDED.next_expiry_at,
           updated_at     = CASE WHEN d.digest_version <> EXCLUDED.digest_version
                                 THEN EXCLUDED.updated_at ELSE d.updated_at END
     WHERE d.digest_version <> EXCLUDED.digest_version
        OR d.next_expiry_at IS DISTINCT FROM EXCLUDED.next_expiry_at
    RETURNING session_id, digest_version, fact_count
), logged AS (
    INSERT INTO events (session_id, kind, detail, created_at)
    SELECT session_id, 'digest_rebuilt',
           jsonb_build_object('digest_version', digest_version, 'facts', fact_count),
           clock_timestamp()
      FROM stored
)
SELECT session_id FROM stored
