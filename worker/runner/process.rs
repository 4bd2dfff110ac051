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
    // 1. Claim: the head turn of a session whose lease is free, leased to this worker with
    // a new fencing token, and the session's last committed turn with it.
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

/// Steps 2–8 of a claimed turn (shared/DESIGN.md, "The turn pipeline"); step 1 is the
/// caller's claim. The generator does 2–6 (its `run_turn` names each step), this function
/// 7 and 8, and a failed attempt ends in [`finish_err`] instead.
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
        // 2–6. Load the KV, prune, build the context, generate, save the snapshot.
        let result = deps.generator.run_turn(deps, &turn, &keeper.lease).await;
        keeper.stop();
        // The engine is free again: the next turn may start while this one commits. Its
        // lease stays until the commit, so the session's next turn cannot.
        let completer = slot.map(|slot| {
            drop(slot.permit);
            slot.freed.notify_one();
            slot.completer
        });
        let output = match result {
            Ok(output) => output,
            Err(TurnError::Aborted) if shutdown.is_cancelled() => {
                queue::release(&deps.pool, &turn).await?;
                info!("released on shutdown");
                return Ok(Outcome::Released(turn.id));
            }
            Err(err) => return finish_err(deps, &turn, err).await,
        };
        // 7. Complete: reply, dialogue, log row and lease release in one fenced transaction.
        if let Some(fenced) = complete(deps, &turn, output, completer.as_ref()).await? {
            return Ok(fenced);
        }
        // 8. Digest post-step: rebuild the session's digest for its next turn.
        deps.generator.after_turn(&turn).await;
        Ok(Outcome::Done(turn.id))
    }
    .instrument(span)
    .await
}

/// Step 7: commits the turn's output under its fence (through the group-commit queue when
/// the worker runs one), then logs and counts it. `Some(Fenced)` when the lease was lost:
/// nothing was written.
async fn complete(
    deps: &Deps,
    turn: &ClaimedTurn,
    mut output: TurnOutput,
    completer: Option<&Completer>,
) -> queue::Result<Option<Outcome>> {
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
            Ok(None)
        }
        Err(QueueError::Fenced(id)) => {
            warn!("completion rejected: lease lost");
            deps.after_fenced(turn).await;
            Ok(Some(Outcome::Fenced(id)))
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
