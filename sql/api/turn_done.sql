-- The one place that builds the kvmem_turn_done payload: {turn_id, session_id, state}.
-- Completion (queue/complete.sql) and failure (queue/notify_done.sql) both call it, so a
-- listener sees the same JSON whatever ended the turn. Delivered at commit.
CREATE OR REPLACE FUNCTION kvmem_notify_turn_done(p_turn_id bigint, p_session_id text, p_state text)
RETURNS void LANGUAGE sql AS $$
    SELECT pg_notify('kvmem_turn_done',
                     json_build_object('turn_id', p_turn_id, 'session_id', p_session_id,
                                       'state', p_state)::text)
$$;
