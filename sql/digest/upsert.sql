-- Store a rebuilt digest. The row changes only when the version (or the next expiry that
-- will change it) does, so an unchanged digest costs no write.
-- $1 session, $2 version, $3 content, $4 tokens, $5 fact count, $6 next expiry.
INSERT INTO state_digest AS d
       (session_id, digest_version, digest_content, digest_tokens, fact_count, next_expiry_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, now())
ON CONFLICT (session_id) DO UPDATE
   SET digest_version = EXCLUDED.digest_version,
       digest_content = EXCLUDED.digest_content,
       digest_tokens  = EXCLUDED.digest_tokens,
       fact_count     = EXCLUDED.fact_count,
       next_expiry_at = EXCLUDED.next_expiry_at,
       updated_at     = CASE WHEN d.digest_version <> EXCLUDED.digest_version
                             THEN now() ELSE d.updated_at END
 WHERE d.digest_version <> EXCLUDED.digest_version
    OR d.next_expiry_at IS DISTINCT FROM EXCLUDED.next_expiry_at
RETURNING digest_version
