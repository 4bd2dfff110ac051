-- BM25 over the dialogue (issue 32): Postgres' ts_rank has no inverse document frequency
-- and no length normalisation of BM25's kind, so each user's term statistics are kept
-- beside the tsvector, where a search reads them with one index lookup per query term.
-- A term counts for a message when it is in the message's own words (speaker and text,
-- weight A), not only in its reply-to context (weight D).

CREATE TABLE memory_lexicon (
    user_id text    NOT NULL,
    term    text    NOT NULL,
    -- Messages of this user whose own words hold the term.
    df      integer NOT NULL CHECK (df >= 0),
    PRIMARY KEY (user_id, term)
);

-- Per user: messages, the sum of their lengths (own-word positions), for BM25's average
-- document length; and who speaks, so a question naming a speaker can prefer their words.
CREATE TABLE memory_lexicon_users (
    user_id   text   PRIMARY KEY,
    docs      bigint NOT NULL CHECK (docs >= 0),
    positions bigint NOT NULL CHECK (positions >= 0)
);
CREATE TABLE memory_speakers (
    user_id  text   NOT NULL,
    speaker  text   NOT NULL,
    messages bigint NOT NULL CHECK (messages >= 0),
    PRIMARY KEY (user_id, speaker)
);

-- A message's own-word positions (its BM25 length).
CREATE FUNCTION kvmem_own_positions(tsv tsvector) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT count(*)::integer FROM unnest(tsv) u, unnest(u.weights) w WHERE w <> 'D'
$$;

-- One statement of new messages updates the statistics once, in key order (two
-- completions of one user lock the shared rows in the same order: no deadlock).
CREATE FUNCTION kvmem_memory_lexicon_add() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO memory_lexicon (user_id, term, df)
    SELECT n.user_id, u.lexeme, count(*)
      FROM new_rows n, unnest(n.tsv) u
     WHERE 'A' = ANY(u.weights)
     GROUP BY 1, 2
     ORDER BY 1, 2
    ON CONFLICT (user_id, term) DO UPDATE SET df = memory_lexicon.df + EXCLUDED.df;
    INSERT INTO memory_lexicon_users (user_id, docs, positions)
    SELECT user_id, count(*), sum(kvmem_own_positions(tsv)) FROM new_rows GROUP BY 1 ORDER BY 1
    ON CONFLICT (user_id) DO UPDATE SET docs = memory_lexicon_users.docs + EXCLUDED.docs,
                                        positions = memory_lexicon_users.positions + EXCLUDED.positions;
    INSERT INTO memory_speakers (user_id, speaker, messages)
    SELECT user_id, speaker, count(*) FROM new_rows GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (user_id, speaker) DO UPDATE SET messages = memory_speakers.messages + EXCLUDED.messages;
    RETURN NULL;
END;
$$;
CREATE TRIGGER memory_messages_lexicon AFTER INSERT ON memory_messages
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION kvmem_memory_lexicon_add();

-- Messages already stored.
INSERT INTO memory_lexicon (user_id, term, df)
SELECT m.user_id, u.lexeme, count(*)
  FROM memory_messages m, unnest(m.tsv) u
 WHERE 'A' = ANY(u.weights)
 GROUP BY 1, 2;
INSERT INTO memory_lexicon_users (user_id, docs, positions)
SELECT user_id, count(*), sum(kvmem_own_positions(tsv)) FROM memory_messages GROUP BY 1;
INSERT INTO memory_speakers (user_id, speaker, messages)
SELECT user_id, speaker, count(*) FROM memory_messages GROUP BY 1, 2;
