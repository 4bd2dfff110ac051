//! A session's digest row and world-state facts as the faces touch them outside a turn:
//! the rotate hint's stored version, the demo's seeded facts, a replay's copy of its
//! source's facts. Here, beside the digest built from those facts, so that the faces run no
//! SQL of their own on `facts` or `state_digest`.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// `session`'s stored digest version and when it last changed, clean or not; `None` before
/// its first digest (`sql/digest/digest_state.sql`).
pub async fn last_change(
    pool: &PgPool,
    session: &str,
) -> Result<Option<(String, DateTime<Utc>)>, sqlx::Error> {
    sqlx::query_as(include_str!("../../../sql/digest/digest_state.sql"))
        .bind(session)
        .fetch_optional(pool)
        .await
}

/// Adds an active world-state fact to `session`, started now (`sql/digest/demo_fact.sql`).
pub async fn seed_fact(
    pool: &PgPool,
    session: &str,
    fact_type: &str,
    key: &str,
    value: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(include_str!("../../../sql/digest/demo_fact.sql"))
        .bind(session)
        .bind(fact_type)
        .bind(key)
        .bind(value)
        .execute(pool)
        .await?;
    Ok(())
}

/// Starts the runbook scene's conflict in `session`: seed 000's war with the Merchant Guild
/// (`sql/digest/demo_conflict.sql`).
pub async fn start_demo_conflict(pool: &PgPool, session: &str) -> Result<(), sqlx::Error> {
    sqlx::query(include_str!("../../../sql/digest/demo_conflict.sql"))
        .bind(session)
        .execute(pool)
        .await?;
    Ok(())
}

/// Copies `from`'s facts into `to`, keeping any `to` already has of the same type and key
/// (`sql/digest/replay_copy_facts.sql`).
pub async fn copy_facts(pool: &PgPool, from: &str, to: &str) -> Result<(), sqlx::Error> {
    sqlx::query(include_str!("../../../sql/digest/replay_copy_facts.sql"))
        .bind(from)
        .bind(to)
        .execute(pool)
        .await?;
    Ok(())
}

/// Whether any of `session`'s facts changed after its first turn was queued
/// (`sql/digest/replay_facts_changed.sql`).
pub async fn facts_changed(pool: &PgPool, session: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(include_str!("../../../sql/digest/replay_facts_changed.sql"))
        .bind(session)
        .fetch_one(pool)
        .await
}
