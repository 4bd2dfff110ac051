//! Enqueueing by hand (CLI, tests, replay) through the same SQL function a backend calls.

use sqlx::PgPool;

use super::types::Result;
use crate::turn::TurnId;

/// A turn as a backend hands it to the queue.
#[derive(Debug, Clone, Copy)]
pub struct NewTurn<'a> {
    pub session_id: &'a str,
    pub user_id: &'a str,
    pub character_id: i64,
    pub message: &'a str,
    /// A retried request with the same key, in the same session, gets the first one's turn
    /// back.
    pub idempotency_key: Option<&'a str>,
}

/// Enqueues through the backend's SQL function, exactly as a backend would.
pub async fn enqueue(
    pool: &PgPool,
    session_id: &str,
    user_id: &str,
    character_id: i64,
    message: &str,
    idempotency_key: Option<&str>,
) -> Result<TurnId> {
    let turn = NewTurn {
        session_id,
        user_id,
        character_id,
        message,
        idempotency_key,
    };
    enqueue_on(pool, &turn, "live").await
}

/// [`enqueue`] on a given lane (`live` or `replay`).
pub async fn enqueue_on(pool: &PgPool, turn: &NewTurn<'_>, lane: &str) -> Result<TurnId> {
    let id: i64 = sqlx::query_scalar(include_str!("../../sql/queue/enqueue.sql"))
        .bind(turn.session_id)
        .bind(turn.user_id)
        .bind(turn.character_id)
        .bind(turn.message)
        .bind(turn.idempotency_key)
        .bind(lane)
        .fetch_one(pool)
        .await?;
    Ok(TurnId(id))
}
