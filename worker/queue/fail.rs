//! Ending an attempt without a reply: a failure (retried with backoff, failed or dead)
//! or a release on shutdown that does not count as an attempt.

use sqlx::PgPool;

use super::finish::{fence, insert_log_rows, notify_done, release_lease};
use super::types::{QueueError, QueueTiming, Result};
use crate::turn::log::KvLog;
use crate::turn::{ClaimedTurn, TurnState};

/// The column of `fail.sql`'s row that `fail` needs: the state the turn moved to.
#[derive(sqlx::FromRow)]
struct Failed {
    state: TurnState,
}

/// Records a failed attempt: back to the queue with backoff, or `failed`/`dead`.
pub async fn fail(
    pool: &PgPool,
    turn: &ClaimedTurn,
    error: &str,
    retryable: bool,
    timing: QueueTiming,
    log: &KvLog,
) -> Result<TurnState> {
    // Scope: the failed attempt's state change, its log row and the lease release.
    let mut tx = pool.begin().await?;
    fence(&mut tx, turn).await?;
    let row: Option<Failed> = sqlx::query_as(include_str!("../../sql/queue/fail.sql"))
        .bind(turn.id.0)
        .bind(error)
        .bind(retryable)
        .bind(timing.backoff_base_ms as f64)
        .bind(timing.backoff_max_ms as f64)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(row) = row else {
        return Err(QueueError::Fenced(turn.id));
    };
    let state = row.state;
    insert_log_rows(&mut tx, vec![log.row(turn)]).await?;
    release_lease(&mut tx, turn).await?;
    if state != TurnState::Queued {
        notify_done(&mut tx, turn, state).await?;
    }
    tx.commit().await?;
    Ok(state)
}

/// Gives a claimed turn back without counting the attempt (graceful shutdown).
pub async fn release(pool: &PgPool, turn: &ClaimedTurn) -> Result<bool> {
    // Scope: the turn's return to the queue and the lease release, guarded by the token.
    let mut tx = pool.begin().await?;
    fence(&mut tx, turn).await?;
    let row = sqlx::query(include_str!("../../sql/queue/release.sql"))
        .bind(turn.id.0)
        .fetch_optional(&mut *tx)
        .await?;
    release_lease(&mut tx, turn).await?;
    tx.commit().await?;
    Ok(row.is_some())
}
