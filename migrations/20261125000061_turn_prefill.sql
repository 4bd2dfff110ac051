-- What a turn decoded before its first reply token, so the per-token cost of a warm turn is
-- measured rather than inferred: prompt tokens decoded (a cold start's lay-back, a prune's
-- re-decode, injected blocks, a changed HUD, the message), and whether the HUD the KV
-- ended with was current and so was not decoded again.
ALTER TABLE turn_log
    ADD COLUMN prefill_tokens integer NOT NULL DEFAULT 0,
    ADD COLUMN hud_kept boolean NOT NULL DEFAULT false;
