-- Memory views for backends and ops. Re-created by `kvmem migrate`; all read-only.
-- Filter by user_id (a hard wall) and, for a character, by
-- `character_id = X OR character_id IS NULL`.
DROP VIEW IF EXISTS kvmem_memories, kvmem_memory_cards, kvmem_memory_history, kvmem_memory_lane,
    kvmem_todos, kvmem_open_todos;

-- Current, active facts (what retrieval sees by default).
CREATE VIEW kvmem_memories AS
SELECT id, user_id, character_id, guild_id, channel_id, subject, kind, fact_type, text,
       entity_refs, entity_label, subtype, importance, pinned, memory_key, source,
       confidence, evidence_text, source_message_ids, valid_from, created_at, updated_at
  FROM memories
 WHERE status = 'ACTIVE' AND valid_to IS NULL;

-- Every version of every key, newest first: the contradiction history.
CREATE VIEW kvmem_memory_history AS
SELECT id, user_id, character_id, guild_id, memory_key, text, status, source,
       valid_from, valid_to, valid_to IS NULL AS current
  FROM memories
 ORDER BY user_id, memory_key, valid_from DESC;

-- Seed 001's entity cards: per user, character and entity ref, the top 3 current facts
-- with importance >= 2 or pinned, ordered pinned, importance, created; formatted
-- `[person:john]: fact1; fact2; fact3`.
CREATE VIEW kvmem_memory_cards AS
WITH facts AS (
    SELECT m.user_id, m.guild_id, m.character_id, r.ref, m.text, m.pinned, m.importance,
           m.created_at, m.id,
           row_number() OVER (PARTITION BY m.user_id, m.guild_id, m.character_id, r.ref
                              ORDER BY m.pinned DESC, m.importance DESC, m.created_at DESC, m.id DESC) AS rn
      FROM memories m
     CROSS JOIN LATERAL unnest(m.entity_refs) AS r(ref)
     WHERE m.status = 'ACTIVE' AND m.valid_to IS NULL AND (m.importance >= 2 OR m.pinned)
)
SELECT user_id, guild_id, character_id, ref AS entity_ref,
       '[' || ref || ']: ' || string_agg(text, '; ' ORDER BY rn) AS card,
       array_agg(id ORDER BY rn) AS memory_ids
  FROM facts
 WHERE rn <= 3
 GROUP BY user_id, guild_id, character_id, ref;

-- The memory lane at a glance: jobs by kind and state, and the overflow drops.
CREATE VIEW kvmem_memory_lane AS
SELECT j.kind, j.state, count(*)::bigint AS jobs,
       (SELECT coalesce(sum(dropped), 0) FROM memory_job_drops)::bigint AS dropped_total
  FROM memory_jobs j
 GROUP BY j.kind, j.state;

-- Seed 001's todos, every status, newest first. A todo is persona-scoped: filter by
-- user_id AND character_id (there is no character_id IS NULL row to fall back to).
CREATE VIEW kvmem_todos AS
SELECT id, user_id, character_id, kind, text, status, due_date, source_message_ids,
       closed_by_message_id, closed_evidence, created_at, updated_at, closed_at
  FROM todos
 ORDER BY user_id, character_id, created_at DESC, id DESC;

-- What a character's context shows: the open todos with one user, due first.
CREATE VIEW kvmem_open_todos AS
SELECT id, user_id, character_id, kind, text, due_date, source_message_ids, created_at
  FROM todos
 WHERE status = 'open'
 ORDER BY user_id, character_id, due_date NULLS LAST, created_at, id;
