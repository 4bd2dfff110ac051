//! The statements that end an attempt inside its transaction, shared by completion and
//! failure: the fence, the lease release, the done notice and the log rows.

use sqlx::{Postgres, Transaction};

use super::types::{QueueError, Result};
use crate::turn::{ClaimedTurn, TurnState};

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

/// Inserts `turn_log` rows made by [`crate::turn::log::KvLog::row`], inside the transaction
/// that records the attempt's outcome.
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
