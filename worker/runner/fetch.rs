//! The claim loop: batched claims ahead of free generation slots, started as slots free
//! up, and handed back untouched on shutdown.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

use super::commit::Completer;
use super::generator::Deps;
use super::lease::LeaseKeeper;
use super::process::{run_claimed, Outcome, Slot};
use crate::queue;
use crate::turn::ClaimedTurn;

/// Claims turns for free slots (and up to `claim_batch` ahead) and starts them. It claims
/// again only when something can have become ready: a NOTIFY, a commit (the session's next
/// turn), the reaper, the poll timer, or a claim that filled every free place (there may be
/// more). A freed slot alone only starts a turn already claimed.
pub(super) async fn fetch_loop(
    deps: Deps,
    wake: Arc<Notify>,
    completer: Completer,
    slots: Arc<Semaphore>,
    shutdown: CancellationToken,
) {
    let settings = deps.settings.clone();
    let capacity = settings.queue.claim_batch.max(settings.queue.concurrency) as usize;
    let affinity = deps.claim_affinity();
    let poll = Duration::from_millis(settings.queue.poll_ms);
    let mut waiting: VecDeque<(ClaimedTurn, LeaseKeeper)> = VecDeque::new();
    let mut running: JoinSet<queue::Result<Outcome>> = JoinSet::new();
    let freed = Arc::new(Notify::new());
    let mut claim_now = true;
    let mut failures = 0u32;
    let starting = Starting {
        deps: &deps,
        slots: &slots,
        freed: &freed,
        completer: &completer,
        shutdown: &shutdown,
    };
    while !shutdown.is_cancelled() {
        crate::faults::panic_point("fetch_loop");
        starting.start_waiting(&mut waiting, &mut running);
        while let Some(done) = running.try_join_next() {
            report(done);
        }
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let generating = settings.queue.concurrency as usize - slots.available_permits();
        let want = capacity.saturating_sub(generating + waiting.len());
        // With a prefetch, top up in halves: claiming every freed place on its own would
        // turn one batched claim into a statement per turn.
        let worth_it = waiting.is_empty() || want >= (capacity / 2).max(1);
        if claim_now && want > 0 && worth_it {
            let claimed = queue::claim_preferring(
                &deps.pool,
                &deps.worker_id,
                settings.queue.lease_ms,
                &settings.queue.lanes,
                want as u32,
                affinity,
            )
            .await;
            match claimed {
                Ok(turns) => {
                    failures = 0;
                    claim_now = turns.len() == want;
                    if !turns.is_empty() {
                        for turn in turns {
                            let keeper = LeaseKeeper::spawn(&deps, &turn, shutdown.clone());
                            waiting.push_back((turn, keeper));
                        }
                        continue;
                    }
                }
                Err(e) => {
                    failures = (failures + 1).min(8);
                    back_off(&e, failures, &shutdown).await;
                    continue;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = &mut notified => claim_now = true,
            _ = freed.notified() => {}
            Some(done) = running.join_next(), if !running.is_empty() => report(done),
            _ = tokio::time::sleep(poll) => claim_now = true,
        }
    }
    hand_back(&deps, waiting, running).await;
}

/// After a failed claim: waits 50 ms doubled per failure in a row, or until shutdown.
async fn back_off(e: &queue::QueueError, failures: u32, shutdown: &CancellationToken) {
    let backoff = Duration::from_millis(50 << failures);
    error!(error = %e, backoff_ms = backoff.as_millis() as u64, "claim failed");
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(backoff) => {}
    }
}

/// What starting a claimed turn in a free slot takes.
struct Starting<'a> {
    deps: &'a Deps,
    slots: &'a Arc<Semaphore>,
    freed: &'a Arc<Notify>,
    completer: &'a Completer,
    shutdown: &'a CancellationToken,
}

impl Starting<'_> {
    /// Starts claimed turns, oldest first, while a slot is free.
    fn start_waiting(
        &self,
        waiting: &mut VecDeque<(ClaimedTurn, LeaseKeeper)>,
        running: &mut JoinSet<queue::Result<Outcome>>,
    ) {
        while !waiting.is_empty() {
            let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                break;
            };
            let Some((turn, keeper)) = waiting.pop_front() else {
                break;
            };
            let slot = Slot {
                permit,
                freed: self.freed.clone(),
                completer: self.completer.clone(),
            };
            let (deps, shutdown) = (self.deps.clone(), self.shutdown.clone());
            running.spawn(
                async move { run_claimed(&deps, turn, keeper, Some(slot), &shutdown).await },
            );
        }
    }
}

/// On shutdown: turns claimed but never started go back to the queue untouched, and the
/// running ones finish.
async fn hand_back(
    deps: &Deps,
    waiting: VecDeque<(ClaimedTurn, LeaseKeeper)>,
    mut running: JoinSet<queue::Result<Outcome>>,
) {
    for (turn, keeper) in waiting {
        keeper.stop();
        if let Err(e) = queue::release(&deps.pool, &turn).await {
            warn!(turn_id = %turn.id, error = %e, "release on shutdown failed; the reaper will requeue it");
        }
    }
    while let Some(done) = running.join_next().await {
        report(done);
    }
}

fn report(done: Result<queue::Result<Outcome>, tokio::task::JoinError>) {
    match done {
        Ok(Ok(_)) => {}
        // The turn keeps its lease; when it runs out, the reaper requeues the turn.
        Ok(Err(e)) => error!(error = %e, "turn not recorded"),
        Err(e) => error!(error = %e, "turn task panicked"),
    }
}
