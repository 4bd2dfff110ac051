//! Enqueueing by hand (CLI, tests, replay) and from the chat endpoint through the same SQL
//! function a backend calls; for the endpoint, a repeat of a request maps to its turn.

use sqlx::{PgConnection, PgPool};

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
    /// The turn's own sampling (`turns.options`, checked by the SQL function); `None`:
    /// the worker's configured sampling.
    pub options: Option<&'a serde_json::Value>,
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
        options: None,
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
        .bind(turn.options.map(sqlx::types::Json))
        .fetch_one(pool)
        .await?;
    Ok(TurnId(id))
}

/// How the chat endpoint tells a retry of a request without an idempotency key from a new
/// request: by a hash of the request and whether the client says it retries.
#[derive(Debug, Clone, Copy)]
pub struct Repeat<'a> {
    /// A hash of the request: user, session, character and body.
    pub hash: &'a str,
    /// The client says this is a retry (the OpenAI SDKs' `x-stainless-retry-count` > 0).
    pub retry: bool,
    /// How long after its turn ended a repeat of a request may still be a retry of it.
    pub window_ms: u64,
}

impl Repeat<'_> {
    /// The window as Postgres' bigint milliseconds.
    pub(super) fn window_i64(&self) -> i64 {
        self.window_ms.min(i64::MAX as u64) as i64
    }
}

/// Enqueues `turn` (live lane, no idempotency key) unless the request repeats the one that
/// queued the session's latest turn while that turn is queued or running, or within
/// `window_ms` of its end when the client says it retries or the turn's answer was never
/// delivered (`sql/queue/repeat_of.sql`). Returns the turn and whether it was there
/// already. Two identical requests sent on purpose, the second after the first's answer,
/// make two turns.
pub async fn enqueue_repeatable(
    pool: &PgPool,
    turn: &NewTurn<'_>,
    repeat: Repeat<'_>,
) -> Result<(TurnId, bool)> {
    // Scope: the look at the session's latest turn and the enqueue after it, under the
    // session's enqueue lock, so two copies of one request arriving together make one turn.
    let mut tx = pool.begin().await?;
    if let Some(id) = lock_and_find_repeat(&mut tx, turn, repeat).await? {
        tx.commit().await?;
        return Ok((id, true));
    }
    let turn = NewTurn {
        idempotency_key: None,
        ..*turn
    };
    let id = queue_in(&mut tx, &turn, repeat.hash).await?;
    tx.commit().await?;
    Ok((id, false))
}

/// Takes the session's enqueue lock in `tx` and finds the turn `repeat` repeats, if any
/// (`sql/queue/repeat_of.sql`).
pub(super) async fn lock_and_find_repeat(
    tx: &mut PgConnection,
    turn: &NewTurn<'_>,
    repeat: Repeat<'_>,
) -> Result<Option<TurnId>> {
    sqlx::query(include_str!("../../sql/queue/enqueue_lock.sql"))
        .bind(turn.session_id)
        .execute(&mut *tx)
        .await?;
    let found: Option<i64> = sqlx::query_scalar(include_str!("../../sql/queue/repeat_of.sql"))
        .bind(turn.session_id)
        .bind(turn.user_id)
        .bind(turn.character_id)
        .bind(repeat.hash)
        .bind(repeat.retry)
        .bind(repeat.window_i64())
        .fetch_optional(&mut *tx)
        .await?;
    Ok(found.map(TurnId))
}

/// Queues `turn` in the live lane inside `tx` and records the request's hash on it.
pub(super) async fn queue_in(
    tx: &mut PgConnection,
    turn: &NewTurn<'_>,
    hash: &str,
) -> Result<TurnId> {
    let id: i64 = sqlx::query_scalar(include_str!("../../sql/queue/enqueue.sql"))
        .bind(turn.session_id)
        .bind(turn.user_id)
        .bind(turn.character_id)
        .bind(turn.message)
        .bind(turn.idempotency_key)
        .bind("live")
        .bind(turn.options.map(sqlx::types::Json))
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query(include_str!("../../sql/queue/request_hash.sql"))
        .bind(id)
        .bind(hash)
        .execute(&mut *tx)
        .await?;
    Ok(TurnId(id))
}
