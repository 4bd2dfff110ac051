-- Event retention: drop the oldest events past the window, at most 10k per call so the
-- reaper tick stays short. $1 retention in hours. Erasure audit events (`erased`: a hash,
-- counts and a time, no content) are the record that an erase was done, and are kept.
DELETE FROM events
 WHERE id IN (SELECT id FROM events
               WHERE created_at < now() - make_interval(secs => $1 * 3600)
                 AND kind <> 'erased'
               ORDER BY id LIMIT 10000)
