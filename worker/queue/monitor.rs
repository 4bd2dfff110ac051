//! The queue as `kvmem status` shows it, from the monitoring views of
//! `sql/views/queue.sql`: read here so that the command only prints.

use sqlx::PgPool;

use super::types::Result;

/// Turns by state: (state, turns) (`sql/queue/status_counts.sql`).
pub async fn state_counts(pool: &PgPool) -> Result<Vec<(String, i64)>> {
    Ok(
        sqlx::query_as::<_, (String, i64)>(include_str!("../../sql/queue/status_counts.sql"))
            .fetch_all(pool)
            .await?,
    )
}

/// The oldest queued turn per lane: (lane, age in seconds, turns queued)
/// (`sql/queue/status_oldest.sql`).
pub async fn oldest_queued(pool: &PgPool) -> Result<Vec<(String, f64, i64)>> {
    Ok(
        sqlx::query_as::<_, (String, f64, i64)>(include_str!("../../sql/queue/status_oldest.sql"))
            .fetch_all(pool)
            .await?,
    )
}

/// A running turn and its lease, as `status_running.sql` returns it.
#[derive(Debug, sqlx::FromRow)]
pub struct RunningTurn {
    pub turn_id: i64,
    pub session_id: String,
    pub owner: Option<String>,
    pub lease_age_s: f64,
    pub expires_in_s: f64,
}

/// The running turns and their leases, at most 50 (`sql/queue/status_running.sql`).
pub async fn running_turns(pool: &PgPool) -> Result<Vec<RunningTurn>> {
    Ok(
        sqlx::query_as::<_, RunningTurn>(include_str!("../../sql/queue/status_running.sql"))
            .fetch_all(pool)
            .await?,
    )
}

/// A dead-lettered turn, as `status_dead.sql` returns it.
#[derive(Debug, sqlx::FromRow)]
pub struct DeadTurn {
    pub turn_id: i64,
    pub session_id: String,
    pub attempts: i32,
    pub error: Option<String>,
}

/// Dead-lettered turns, at most 20 (`sql/queue/status_dead.sql`).
pub async fn dead_turns(pool: &PgPool) -> Result<Vec<DeadTurn>> {
    Ok(
        sqlx::query_as::<_, DeadTurn>(include_str!("../../sql/queue/status_dead.sql"))
            .fetch_all(pool)
            .await?,
    )
}

/// The last hour's successful turns and their p50 and p95 latency in milliseconds
/// (`sql/queue/status_latency.sql`).
pub async fn latency(pool: &PgPool) -> Result<(i64, Option<f64>, Option<f64>)> {
    Ok(
        sqlx::query_as::<_, (i64, Option<f64>, Option<f64>)>(include_str!(
            "../../sql/queue/status_latency.sql"
        ))
        .fetch_one(pool)
        .await?,
    )
}

/// Warm and cold starts (`sql/queue/status_warm.sql`).
pub async fn warm_cold(pool: &PgPool) -> Result<(i64, i64)> {
    Ok(
        sqlx::query_as::<_, (i64, i64)>(include_str!("../../sql/queue/status_warm.sql"))
            .fetch_one(pool)
            .await?,
    )
}
