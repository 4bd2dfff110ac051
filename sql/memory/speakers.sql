-- Who speaks in one user's dialogue (autocommit read), for questions that name a speaker.
SELECT speaker FROM memory_speakers WHERE user_id = $1 AND messages > 0
