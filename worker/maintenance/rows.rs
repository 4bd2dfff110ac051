//! Row retention: the rows a finished turn or job no longer needs (log rows, turns that
//! ended without a reply, finished and dropped jobs) are deleted once their window has
//! passed, a bounded batch per statement so no sweep holds its locks for long. The dialogue
//! (`messages`, and the done turns it references) and memories stay until erased.

use sqlx::{PgPool, Result};

/// Most rows one statement deletes; a sweep runs at most [`BATCHES`] of them per table.
pub const BATCH: i64 = 5000;
/// Batches per table per sweep: a backlog drains over a few sweeps instead of one long one.
pub const BATCHES: usize = 20;

/// How long each kind of finished row is kept, in hours; 0 keeps it.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Done memory and summary jobs, dropped memory jobs.
    pub finished_hours: u64,
    /// Dead and failed turns (with their log rows), failed memory and summary jobs.
    pub failed_hours: u64,
    /// `turn_log` rows.
    pub log_hours: u64,
}

/// Rows one sweep deleted, per table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Retained {
    pub turns: u64,
    pub turn_log: u64,
    pub memory_jobs: u64,
    pub summary_jobs: u64,
}

impl Retained {
    /// `(table, rows)` pairs, for the counters.
    pub fn by_table(&self) -> [(&'static str, u64); 4] {
        [
            ("turns", self.turns),
            ("turn_log", self.turn_log),
            ("memory_jobs", self.memory_jobs),
            ("summary_jobs", self.summary_jobs),
        ]
    }
}

/// One sweep: every kind of row whose window has passed, a batch at a time, each batch
/// its own autocommit statement.
pub async fn retain(pool: &PgPool, r: Retention) -> Result<Retained> {
    let mut out = Retained::default();
    if r.failed_hours > 0 {
        for _ in 0..BATCHES {
            let (turns, logs): (i64, i64) =
                sqlx::query_as(include_str!("../../sql/maintenance/retain_ended_turns.sql"))
                    .bind(r.failed_hours as f64)
                    .bind(BATCH)
                    .fetch_one(pool)
                    .await?;
            out.turns += turns as u64;
            out.turn_log += logs as u64;
            if turns < BATCH {
                break;
            }
        }
    }
    if r.log_hours > 0 {
        out.turn_log += batches(
            pool,
            include_str!("../../sql/maintenance/retain_turn_log.sql"),
            r.log_hours,
            None,
        )
        .await?;
    }
    let jobs = [
        (r.finished_hours, &["done", "dropped"][..]),
        (r.failed_hours, &["failed"][..]),
    ];
    for (hours, states) in jobs {
        if hours == 0 {
            continue;
        }
        out.memory_jobs += batches(
            pool,
            include_str!("../../sql/maintenance/retain_memory_jobs.sql"),
            hours,
            Some(states),
        )
        .await?;
        out.summary_jobs += batches(
            pool,
            include_str!("../../sql/maintenance/retain_summary_jobs.sql"),
            hours,
            Some(states),
        )
        .await?;
    }
    Ok(out)
}

/// Runs one retention statement until a batch comes back short, at most [`BATCHES`] times.
async fn batches(pool: &PgPool, sql: &str, hours: u64, states: Option<&[&str]>) -> Result<u64> {
    let mut deleted = 0;
    for _ in 0..BATCHES {
        let q = sqlx::query(sql).bind(hours as f64);
        let q = match states {
            Some(states) => q.bind(states),
            None => q,
        };
        let n = q.bind(BATCH).execute(pool).await?.rows_affected();
        deleted += n;
        if n < BATCH as u64 {
            break;
        }
    }
    Ok(deleted)
}

/// Adds one sweep's removals to the totals `kvmem status` shows; zeros are skipped.
pub async fn count(pool: &PgPool, counts: &[(String, u64)]) -> Result<()> {
    let (names, values): (Vec<&str>, Vec<i64>) = counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| (name.as_str(), *n as i64))
        .unzip();
    if names.is_empty() {
        return Ok(());
    }
    sqlx::query(include_str!("../../sql/maintenance/storage_count.sql"))
        .bind(&names)
        .bind(&values)
        .execute(pool)
        .await?;
    Ok(())
}

/// The totals `count` has added up, every worker's, by name (`kvmem status`)
/// (`sql/maintenance/status_storage.sql`).
pub async fn storage_totals(pool: &PgPool) -> Result<Vec<(String, i64)>> {
    sqlx::query_as::<_, (String, i64)>(include_str!("../../sql/maintenance/status_storage.sql"))
        .fetch_all(pool)
        .await
}
