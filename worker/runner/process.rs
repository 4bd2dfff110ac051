//! One turn from claim to outcome: run it, then commit the reply (fenced) or record the
//! failure, so every claimed turn ends done, retrying, failed, dead, fenced or released.

use std::sync::Arc;
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use super::commit::Completer;
use super::generator::Deps;
use super::lease::LeaseKeeper;
use crate::queue::{self, Completion, QueueError};
use crate::turn::log::KvLog;
use crate::turn::{ClaimedTurn, TurnError, TurnId, TurnOutput, TurnState};

/// What one call of [`process_next_turn`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was runnable.
    Empty,
    Done(TurnId),
    /// Failed, back in the queue with backoff.
    Retrying(TurnId),
    /// Failed for good: bad input.
    Failed(TurnId),
    /// Out of attempts.
    Dead(TurnId),
    /// The lease was lost; another worker owns the turn now. Nothing was written.
    Fenced(TurnId),
    /// Given back untouched on shutdown.
    Released(TurnId),
}

/// Claims one turn and runs it to an outcome. Tests drain the queue by calling this.
pub async fn process_next_turn(
    deps: &Deps,
    shutdown: &CancellationToken,
) -> queue::Result<Outcome> {
    let Some(turn) = queue::claim(
        &deps.pool,
        &deps.worker_id,
        deps.settings.queue.lease_ms,
        &deps.settings.queue.lanes,
    )
    .await?
    else {
        return Ok(Outcome::Empty);
    };
    let keeper = LeaseKeeper::spawn(deps, &turn, shutdown.clone());
    run_claimed(deps, turn, keeper, None, shutdown).await
}

/// What a turn started by [`run`] holds besides its lease: a generation slot, freed as
/// soon as the generation ends, and the group-commit queue for its completion.
pub(super) struct Slot {
    pub(super) permit: OwnedSemaphorePermit,
    pub(super) freed: Arc<Notify>,
    pub(super) completer: Completer,
}

pub(super) async fn run_claimed(
    deps: &Deps,
    turn: ClaimedTurn,
    keeper: LeaseKeeper,
    slot: Option<Slot>,
    shutdown: &CancellationToken,
) -> queue::Result<Outcome> {
    let span = tracing::info_span!("turn", turn_id = %turn.id, sid = %turn.session_id, attempt = turn.attempt);
    async move {
        info!("started");
        let result = deps
            .generator
            .run_turn(deps, &turn, keeper.abort.clone())
            .await;
        keeper.stop();
        // The engine is free again: the next turn may start while this one commits. Its
        // lease stays until the commit, so the session's next turn cannot.
        let completer = slot.map(|slot| {
            drop(slot.permit);
            slot.freed.notify_one();
            slot.completer
        });
        match result {
            Ok(output) => finish_ok(deps, &turn, output, completer.as_ref()).await,
            Err(TurnError::Aborted) if shutdown.is_cancelled() => {
                queue::release(&deps.pool, &turn).await?;
                info!("released on shutdown");
                Ok(Outcome::Released(turn.id))
            }
            Err(err) => finish_err(deps, &turn, err).await,
        }
    }
    .instrument(span)
    .await
}

async fn finish_ok(
    deps: &Deps,
    turn: &ClaimedTurn,
    mut output: TurnOutput,
    completer: Option<&Completer>,
) -> queue::Result<Outcome> {
    output.log.finish();
    let log = output.log.clone();
    let committed = match completer {
        Some(completer) => {
            completer
                .complete(Completion {
                    turn: turn.clone(),
                    output,
                })
                .await
        }
        None => queue::complete(&deps.pool, turn, output).await,
    };
    match committed {
        Ok(()) => {
            log.emit();
            deps.metrics.turn(&log);
            info!(latency_ms = log.latency_ms, "completed");
            deps.generator.after_turn(turn).await;
            Ok(Outcome::Done(turn.id))
        }
        Err(QueueError::Fenced(id)) => {
            warn!("completion rejected: lease lost");
            deps.after_fenced(turn).await;
            Ok(Outcome::Fenced(id))
        }
        Err(e) => Err(e),
    }
}

async fn finish_err(deps: &Deps, turn: &ClaimedTurn, err: TurnError) -> queue::Result<Outcome> {
    let message = err.to_string();
    let mut log = err
        .log()
        .unwrap_or_else(|| {
            KvLog::start(
                deps.generator.path(),
                &turn.session_id,
                deps.settings.engine.n_ctx,
            )
        })
        .failed(&message);
    log.finish();
    log.emit();
    deps.metrics.turn(&log);
    let state = match queue::fail(
        &deps.pool,
        turn,
        &message,
        err.is_retryable(),
        deps.timing(),
        &log,
    )
    .await
    {
        Ok(state) => state,
        Err(QueueError::Fenced(id)) => {
            warn!("failure not recorded: lease lost");
            deps.after_fenced(turn).await;
            return Ok(Outcome::Fenced(id));
        }
        Err(e) => return Err(e),
    };
    warn!(error = %message, state = ?state, "turn attempt failed");
    Ok(match state {
        TurnState::Queued => Outcome::Retrying(turn.id),
        TurnState::Dead => Outcome::Dead(turn.id),
        _ => Outcome::Failed(turn.id),
    })
}
