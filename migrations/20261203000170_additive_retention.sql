-- Retention (issue 57): the reaper deletes the rows a finished turn or job no longer needs,
-- a bounded batch at a time, oldest first. These partial indexes hold only the finished
-- rows each sweep looks at, so a sweep never scans the live part of a table.
CREATE INDEX turns_ended_idx ON turns (finished_at) WHERE state IN ('dead', 'failed');
CREATE INDEX memory_jobs_finished_idx ON memory_jobs (finished_at)
    WHERE state IN ('done', 'dropped', 'failed');
CREATE INDEX summary_jobs_finished_idx ON summary_jobs (finished_at)
    WHERE state IN ('done', 'failed');

-- What the storage upkeep removed, summed over every worker since the table was made
-- (snapshot evictions, quarantine removals, rows per table), for `kvmem status`. No user
-- data: one row per counter.
CREATE TABLE kvmem_storage_counts (
    name       text        PRIMARY KEY,
    value      bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
