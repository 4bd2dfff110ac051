-- A new version of a key (inside the upsert's transaction). It starts closed
-- (valid_to = valid_from) so the one-current-version index never sees two open rows;
-- relink.sql then opens the newest.
INSERT INTO memories (user_id, character_id, guild_id, channel_id, subject, kind, fact_type, text,
                      entity_refs, entity_label, subtype, importance, pinned, memory_key, source,
                      confidence, evidence_text, source_message_ids, valid_from, valid_to,
                      embedding, embed_model)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $19,
        $20, $21)
RETURNING id
