-- Inside the completion transaction: the KV's dialogue after each committed turn, one row
-- per session, replaced turn by turn.
-- $1 JSON array of {turn_id, session_id, user_id, character_id, model_sha, token_ids,
-- segments, digest_version}, $2 the turn ids that committed.
INSERT INTO session_kv (session_id, user_id, character_id, turn_id, model_sha, token_ids,
                        segments, digest_version, updated_at)
SELECT i.session_id, i.user_id, i.character_id, i.turn_id, i.model_sha,
       ARRAY(SELECT t.id::int4
               FROM jsonb_array_elements_text(i.token_ids) WITH ORDINALITY AS t(id, n)
              ORDER BY t.n),
       i.segments, i.digest_version, now()
  FROM jsonb_to_recordset($1) AS i(turn_id bigint, session_id text, user_id text,
                                   character_id bigint, model_sha text, token_ids jsonb,
                                   segments text, digest_version text)
 WHERE i.turn_id = ANY($2)
ON CONFLICT (session_id) DO UPDATE
   SET user_id = EXCLUDED.user_id, character_id = EXCLUDED.character_id,
       turn_id = EXCLUDED.turn_id, model_sha = EXCLUDED.model_sha,
       token_ids = EXCLUDED.token_ids, segments = EXCLUDED.segments,
       digest_version = EXCLUDED.digest_version, updated_at = EXCLUDED.updated_at
