//! Enqueueing by hand (CLI, tests, replay) through the same SQL function a backend calls.

use sqlx::PgPool;

use super::{Result, TurnId};

/// Enqueues through the backend's SQL function, exactly as a backend would.
pub async fn enqueue(
    pool: &PgPool,
    session_id: &str,
    user_id: &str,
    character_id: i64,
    message: &str,
    idempotency_key: Option<&str>,
) -> Result<TurnId> {
    enqueue_on(
        pool,
        session_id,
        user_id,
        character_id,
        message,
        idempotency_key,
        "live",
    )
    .await
}

/// [`enqueue`] on a given lane (`live` or `replay`).
pub async fn enqueue_on(
    pool: &PgPool,
    session_id: &str,
    user_id: &str,
    character_id: i64,
    message: &str,
    idempotency_key: Option<&str>,
    lane: &str,
) -> Result<TurnId> {
    let id: i64 = sqlx::query_scalar(include_str!("../../sql/queue/enqueue.sql"))
        .bind(session_id)
        .bind(user_id)
        .bind(character_id)
        .bind(message)
        .bind(idempotency_key)
        .bind(lane)
        .fetch_one(pool)
        .await?;
    Ok(TurnId(id))
}
