//! What the demo's memory and recall scenes set and read of the summary layer to show it at
//! work: a shorter session idle timeout, the sessions and when they closed, the summaries
//! made and the lane's events. Here so that the demo runs no SQL of its own on the
//! summary tables.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;

use super::Result;

/// The session idle timeout in seconds as stored, if set
/// (`sql/summary/demo_idle_get.sql`).
pub async fn idle_timeout(pool: &PgPool) -> Result<Option<String>> {
    Ok(
        sqlx::query_scalar(include_str!("../../sql/summary/demo_idle_get.sql"))
            .fetch_optional(pool)
            .await?,
    )
}

/// Sets the session idle timeout, in seconds (`sql/summary/demo_idle_set.sql`).
pub async fn set_idle_timeout(pool: &PgPool, seconds: &str) -> Result<()> {
    sqlx::query(include_str!("../../sql/summary/demo_idle_set.sql"))
        .bind(seconds)
        .execute(pool)
        .await?;
    Ok(())
}

/// The part of a summary session (`demo_sessions.sql`) the demo's wait reads.
#[derive(Debug, sqlx::FromRow)]
pub struct DemoSession {
    pub id: i64,
    pub ended_at: Option<DateTime<Utc>>,
}

/// `user`'s summary sessions with `character`, oldest first
/// (`sql/summary/demo_sessions.sql`).
pub async fn sessions(pool: &PgPool, user: &str, character: i64) -> Result<Vec<DemoSession>> {
    Ok(
        sqlx::query_as::<_, DemoSession>(include_str!("../../sql/summary/demo_sessions.sql"))
            .bind(user)
            .bind(character)
            .fetch_all(pool)
            .await?,
    )
}

/// Whether summary session `session` has a summary row, made or failed
/// (`sql/summary/demo_session_summary.sql`).
pub async fn session_summarised(pool: &PgPool, session: i64) -> Result<bool> {
    Ok(
        sqlx::query(include_str!("../../sql/summary/demo_session_summary.sql"))
            .bind(session)
            .fetch_optional(pool)
            .await?
            .is_some(),
    )
}

/// Whether a rolling summary job of `user` with `character` has finished, made or failed
/// (`sql/summary/demo_rolling_finished.sql`).
pub async fn rolling_finished(pool: &PgPool, user: &str, character: i64) -> Result<bool> {
    Ok(
        sqlx::query(include_str!("../../sql/summary/demo_rolling_finished.sql"))
            .bind(user)
            .bind(character)
            .fetch_optional(pool)
            .await?
            .is_some(),
    )
}

/// The newest rolling summary of `user` with `character`: its content, the messages it
/// covers and the model's time in ms (`sql/summary/demo_rolling.sql`).
pub async fn newest_rolling(
    pool: &PgPool,
    user: &str,
    character: i64,
) -> Result<Option<(String, i32, i32)>> {
    Ok(
        sqlx::query_as::<_, (String, i32, i32)>(include_str!("../../sql/summary/demo_rolling.sql"))
            .bind(user)
            .bind(character)
            .fetch_optional(pool)
            .await?,
    )
}

/// A session's summary or the error stored instead, as `demo_session_summary.sql` returns it.
#[derive(Debug, sqlx::FromRow)]
pub struct SessionSummary {
    pub status: String,
    pub summary: Option<Value>,
    pub error: Option<String>,
    pub attempts: i32,
    pub elapsed_ms: i32,
}

/// Summary session `session`'s newest summary row; an error when it has none
/// (`sql/summary/demo_session_summary.sql`).
pub async fn session_summary(pool: &PgPool, session: i64) -> Result<SessionSummary> {
    Ok(sqlx::query_as::<_, SessionSummary>(include_str!(
        "../../sql/summary/demo_session_summary.sql"
    ))
    .bind(session)
    .fetch_one(pool)
    .await?)
}

/// The summary layer's events about `user`, in order: when, kind and detail
/// (`sql/summary/demo_summary_events.sql`).
pub async fn summary_events(
    pool: &PgPool,
    user: &str,
) -> Result<Vec<(DateTime<Utc>, String, Value)>> {
    Ok(
        sqlx::query_as::<_, (DateTime<Utc>, String, Value)>(include_str!(
            "../../sql/summary/demo_summary_events.sql"
        ))
        .bind(user)
        .fetch_all(pool)
        .await?,
    )
}

/// `user`'s newest session summary: its status and summary
/// (`sql/summary/demo_recall_summary.sql`).
pub async fn newest_session_summary(
    pool: &PgPool,
    user: &str,
) -> Result<Option<(String, Option<Value>)>> {
    Ok(sqlx::query_as::<_, (String, Option<Value>)>(include_str!(
        "../../sql/summary/demo_recall_summary.sql"
    ))
    .bind(user)
    .fetch_optional(pool)
    .await?)
}
