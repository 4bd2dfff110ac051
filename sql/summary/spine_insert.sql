-- A new spine version (autocommit). The unique (user_id, version) refuses a racing twin.
INSERT INTO summary_spine (user_id, version, content, sections, message_count, message_total_at, elapsed_ms)
VALUES ($1, coalesce((SELECT max(version) FROM summary_spine WHERE user_id = $1), 0) + 1,
        $2, $3, $4, $5, $6)
RETURNING version
