-- Is the session the user's: no other user's turns, and turns or imported messages of
-- the user? $1 user, $2 session.
SELECT NOT EXISTS (SELECT 1 FROM turns WHERE session_id = $2 AND user_id <> $1)
   AND (EXISTS (SELECT 1 FROM turns WHERE session_id = $2 AND user_id = $1)
        OR EXISTS (SELECT 1 FROM memory_messages WHERE session_id = $2 AND user_id = $1))
