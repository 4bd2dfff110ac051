//! The worker: claims turns, runs them through the generator and commits them. One turn is
//! [`process_next_turn`]; [`run`] adds batched claims (`fetch`), leases (`lease`),
//! group commit (`commit`), wake-ups (`listen`), housekeeping (`crate::maintenance`) and
//! the idle lanes (`lanes`), and stops everything on a signal or when one of its tasks dies.

mod commit;
mod fetch;
pub mod generator;
mod lanes;
mod lease;
mod listen;
mod process;

use std::sync::Arc;

use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

pub use generator::{Deps, Echo, Generator};
pub use process::{process_next_turn, Outcome};

/// A fresh worker id: host, pid and a random suffix, so restarts never reuse one.
pub fn new_worker_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!(
        "{host}:{}:{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// Why a worker stopped without being asked to.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// One of the worker's tasks (fetch loop, listener, reaper, rebuilder) ended early,
    /// most likely in a panic. The others were stopped: a half-alive worker would hold no
    /// turns but look healthy.
    #[error("worker task died: {0}")]
    TaskDied(String),
}

/// Runs the worker until `shutdown`: `settings.queue.concurrency` turns at a time, claimed in
/// batches and committed in groups. Returns an error, after stopping everything, if any
/// of its tasks ends before `shutdown`.
pub async fn run(deps: Deps, shutdown: CancellationToken) -> Result<(), WorkerError> {
    // The tasks stop on the caller's shutdown, or on this worker's own when one dies.
    let shutdown = shutdown.child_token();
    let wake = Arc::new(Notify::new());
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(listen::listen_for_turns(
        deps.clone(),
        wake.clone(),
        shutdown.clone(),
    ));
    crate::maintenance::spawn(deps.housekeeping(), wake.clone(), &mut tasks, &shutdown);
    deps.generator
        .spawn_background(&deps, &mut tasks, shutdown.clone());
    let (completer, committing) = commit::Completer::spawn(
        deps.pool.clone(),
        deps.settings.queue.complete_batch as usize,
        wake.clone(),
        deps.metrics.clone(),
    );
    let slots = Arc::new(Semaphore::new(deps.settings.queue.concurrency as usize));
    let lanes_on = deps.settings.memory.lane || deps.settings.summary.lane;
    if deps.engine.is_some() && lanes_on {
        tasks.spawn(lanes::idle_lanes(
            deps.clone(),
            slots.clone(),
            shutdown.clone(),
        ));
    }
    tasks.spawn(fetch::fetch_loop(
        deps.clone(),
        wake,
        completer,
        slots,
        shutdown.clone(),
    ));
    info!(
        worker_id = %deps.worker_id,
        concurrency = deps.settings.queue.concurrency,
        claim_batch = deps.settings.queue.claim_batch,
        complete_batch = deps.settings.queue.complete_batch,
        "worker started"
    );
    let mut died = None;
    while let Some(ended) = tasks.join_next().await {
        if !shutdown.is_cancelled() {
            let why = match ended {
                Err(e) => e.to_string(),
                Ok(()) => "a task returned before shutdown".to_string(),
            };
            error!(error = %why, "worker task died; stopping the worker");
            died.get_or_insert(why);
            shutdown.cancel();
        }
    }
    // Every sender is gone once the fetch loop has returned: the last batch is committed.
    let _ = committing.await;
    info!("worker stopped");
    match died {
        Some(why) => Err(WorkerError::TaskDied(why)),
        None => Ok(()),
    }
}
