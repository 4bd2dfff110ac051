//! The turn queue in Postgres: claim with a per-session lease, heartbeat, fenced
//! completion, retry or death, and the reaper. Every statement lives in `sql/queue/`.

use sqlx::{Postgres, Transaction};

mod claim;
mod complete;
mod enqueue;
mod fail;
mod reap;

pub use crate::turn::{ClaimedTurn, TurnId, TurnState};
pub use claim::{claim, claim_preferring, claim_up_to, heartbeat, last_done, lease_held};
pub use complete::{complete, complete_many, Completion};
pub use enqueue::{enqueue, enqueue_on, NewTurn};
pub use fail::{fail, release};
pub use reap::{reap, trim_events, Reaped};

/// Channel the enqueue function notifies, payload = session id.
pub const TURNS_CHANNEL: &str = "kvmem_turns";
/// Channel announcing finished turns, payload = JSON `{turn_id, session_id, state}`.
pub const TURN_DONE_CHANNEL: &str = "kvmem_turn_done";

/// Queue errors. `Fenced` means another worker owns the session now: drop the work.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("lease lost for turn {0}: another worker owns the session now")]
    Fenced(TurnId),
    #[error("the worker's commit queue has stopped")]
    Stopped,
}

pub type Result<T, E = QueueError> = std::result::Result<T, E>;

/// Lease and backoff settings, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct QueueTiming {
    pub lease_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
}

/// Locks the lease row and checks this worker still holds it.
pub(super) async fn fence(tx: &mut Transaction<'_, Postgres>, turn: &ClaimedTurn) -> Result<()> {
    let held = sqlx::query(include_str!("../../sql/queue/fence.sql"))
        .bind(&turn.session_id)
        .bind(turn.fencing_token)
        .bind(&turn.owner)
        .bind(turn.id.0)
        .fetch_optional(&mut **tx)
        .await?;
    match held {
        Some(_) => Ok(()),
        None => Err(QueueError::Fenced(turn.id)),
    }
}

pub(super) async fn release_lease(
    tx: &mut Transaction<'_, Postgres>,
    turn: &ClaimedTurn,
) -> Result<()> {
    sqlx::query(include_str!("../../sql/queue/release_lease.sql"))
        .bind(&turn.session_id)
        .bind(turn.fencing_token)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(super) async fn notify_done(
    tx: &mut Transaction<'_, Postgres>,
    turn: &ClaimedTurn,
    state: TurnState,
) -> Result<()> {
    let state = match state {
        TurnState::Queued => "queued",
        TurnState::Running => "running",
        TurnState::Done => "done",
        TurnState::Failed => "failed",
        TurnState::Dead => "dead",
    };
    sqlx::query(include_str!("../../sql/queue/notify_done.sql"))
        .bind(turn.id.0)
        .bind(&turn.session_id)
        .bind(state)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Inserts `turn_log` rows made by [`KvLog::row`], inside the transaction that records the
/// attempt's outcome.
pub(super) async fn insert_log_rows(
    tx: &mut Transaction<'_, Postgres>,
    rows: Vec<serde_json::Value>,
) -> Result<(), sqlx::Error> {
    sqlx::query(include_str!("../../sql/turn/insert_log.sql"))
        .bind(serde_json::Value::Array(rows))
        .execute(&mut **tx)
        .await?;
    Ok(())
}
