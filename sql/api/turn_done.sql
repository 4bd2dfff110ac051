-- The one place that builds the kvmem_turn_done payload: {turn_id, session_id, state}.
-- Completion (queue/complete.sql) and failure (queue/notify_done.sql) both call it, so a
-- listener sees the same JSON whatever ended the turn. Delivered at commit. The same
-- payload also ends the turn's stream on its turn and session channels (sql/api/stream.sql),
-- so a reader scoped to one turn or one session needs no other channel.
CREATE OR REPLACE FUNCTION kvmem_notify_turn_done(p_turn_id bigint, p_session_id text, p_state text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_body text := json_build_object('turn_id', p_turn_id, 'session_id', p_session_id,
                                     'state', p_state)::text;
BEGIN
    PERFORM pg_notify('kvmem_turn_done', v_body);
    PERFORM pg_notify(kvmem_turn_channel(p_turn_id), v_body);
    PERFORM pg_notify(kvmem_session_channel(p_session_id), v_body);
END
$$;
