-- The conversation in a chat request finds its session (issue 60). Each done turn carries a
-- chain hash over its session's dialogue up to and including it, so a front-end that sends
-- the whole history on every request (and no id of kvmem's) is matched to the session whose
-- stored dialogue is that history word for word:
--   h_n = sha256(h_{n-1} || be64(len u) || u || be64(len r) || r), h_0 = the empty string,
-- u and r the turn's message and reply, trimmed of spaces, tabs, CR and LF at both ends,
-- lengths in UTF-8 bytes. The worker sets it in the fenced completion; a turn after one
-- without a hash (done before this migration, or by an older worker) gets none, and such a
-- session is never matched. `origin` marks turns that never ran here: 'branch' (a copy of
-- `copied_from`, made when a request branched the session at it) and 'import' (history a
-- request brought for a new session). Additive: nullable columns, a new function and
-- indexes, which a worker of the previous release ignores.
ALTER TABLE turns ADD COLUMN chain_hash bytea;
ALTER TABLE turns ADD COLUMN origin text;
ALTER TABLE turns ADD COLUMN copied_from bigint;

CREATE FUNCTION kvmem_chain_hash(prev bytea, message text, reply text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT sha256(coalesce(prev, ''::bytea)
                  || int8send(octet_length(btrim(message, E' \t\r\n')))
                  || convert_to(btrim(message, E' \t\r\n'), 'UTF8')
                  || int8send(octet_length(btrim(reply, E' \t\r\n')))
                  || convert_to(btrim(reply, E' \t\r\n'), 'UTF8'))
$$;

CREATE INDEX turns_chain_idx ON turns (user_id, character_id, chain_hash)
    WHERE chain_hash IS NOT NULL;
-- A repeat of a chat request that named no session is found by its hash among the user's turns.
CREATE INDEX turns_request_hash_idx ON turns (user_id, character_id, request_hash)
    WHERE request_hash IS NOT NULL;
