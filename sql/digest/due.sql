-- Sessions whose digest must be rebuilt now: marked dirty, or an included fact expired.
SELECT session_id FROM digest_dirty
UNION
SELECT session_id FROM state_digest WHERE next_expiry_at <= now()
LIMIT 500
