//! What `kvmem summary show`, `kvmem summary rebuild` and `kvmem status` ask of the summary
//! layer: each character's state and summaries, the spine, the lane's jobs and latest
//! failures, and the rebuild's jobs. Read and queued here; the commands only print.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;

use super::Result;

/// Queues a rolling summary per character of `user` (one `character`, or all), a session
/// summary per closed session and a spine, all due now; how many jobs it queued (jobs
/// already queued are not queued twice) (`sql/summary/rebuild_queue.sql`).
pub async fn queue_rebuild(pool: &PgPool, user: &str, character: Option<i64>) -> Result<i64> {
    Ok(
        sqlx::query_scalar(include_str!("../../sql/summary/rebuild_queue.sql"))
            .bind(user)
            .bind(character)
            .fetch_one(pool)
            .await?,
    )
}

/// One character's row of `show.sql`.
#[derive(Debug, sqlx::FromRow)]
pub struct CharacterSummaries {
    pub character_id: i64,
    pub state: Value,
    pub rolling_summary: String,
    pub rolling_versions: i64,
    pub sessions: Option<Value>,
    pub open_session: Option<Value>,
}

/// `user`'s session state, rolling summary, latest session summaries and open session, per
/// character (one `character`, or all) (`sql/summary/show.sql`).
pub async fn character_summaries(
    pool: &PgPool,
    user: &str,
    character: Option<i64>,
) -> Result<Vec<CharacterSummaries>> {
    Ok(sqlx::query_as(include_str!("../../sql/summary/show.sql"))
        .bind(user)
        .bind(character)
        .fetch_all(pool)
        .await?)
}

/// `user`'s current spine: its version and content (`sql/summary/spine_current.sql`).
pub async fn spine_current(pool: &PgPool, user: &str) -> Result<Option<(i32, String)>> {
    // Decoded by position: `spine_current.sql` selects version, then content first.
    Ok(
        sqlx::query_as(include_str!("../../sql/summary/spine_current.sql"))
            .bind(user)
            .fetch_optional(pool)
            .await?,
    )
}

/// One line of `status.sql`: how many summary jobs of a kind are in a state.
#[derive(Debug, sqlx::FromRow)]
pub struct LaneCount {
    pub kind: String,
    pub state: String,
    pub jobs: i64,
}

/// The summary lane's jobs by kind and state (`sql/summary/status.sql`).
pub async fn lane_counts(pool: &PgPool) -> Result<Vec<LaneCount>> {
    Ok(sqlx::query_as(include_str!("../../sql/summary/status.sql"))
        .fetch_all(pool)
        .await?)
}

/// One event of `recent_failures.sql`.
#[derive(Debug, sqlx::FromRow)]
pub struct Failure {
    pub kind: String,
    pub detail: Value,
    pub created_at: DateTime<Utc>,
}

/// The latest `limit` summary failures and degradations, newest first
/// (`sql/summary/recent_failures.sql`).
pub async fn recent_failures(pool: &PgPool, limit: i64) -> Result<Vec<Failure>> {
    Ok(
        sqlx::query_as(include_str!("../../sql/summary/recent_failures.sql"))
            .bind(limit)
            .fetch_all(pool)
            .await?,
    )
}
