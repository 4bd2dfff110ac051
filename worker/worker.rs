//! The worker: one turn is [`process_next_turn`], and the loop around it only waits for work,
//! reaps expired leases and stops on a signal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn, Instrument};

use crate::config::Settings;
use crate::generator::{Generator, TurnError};
use crate::kvlog::KvLog;
use crate::queue::{self, ClaimedTurn, QueueError, QueueTiming, TurnId, TurnState};

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

/// What a turn needs; cheap to clone.
#[derive(Clone)]
pub struct Deps {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    pub generator: Generator,
    pub worker_id: String,
}

impl Deps {
    fn timing(&self) -> QueueTiming {
        QueueTiming {
            lease_ms: self.settings.lease_ms,
            backoff_base_ms: self.settings.backoff_base_ms,
            backoff_max_ms: self.settings.backoff_max_ms,
        }
    }
}

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

/// Claims one turn and runs it to an outcome. Tests drain the queue by calling this.
pub async fn process_next_turn(
    deps: &Deps,
    shutdown: &CancellationToken,
) -> queue::Result<Outcome> {
    let Some(turn) = queue::claim(
        &deps.pool,
        &deps.worker_id,
        deps.settings.lease_ms,
        &deps.settings.lanes,
    )
    .await?
    else {
        return Ok(Outcome::Empty);
    };
    let span = tracing::info_span!("turn", turn_id = %turn.id, sid = %turn.session_id, attempt = turn.attempt);
    run_claimed(deps, turn, shutdown).instrument(span).await
}

async fn run_claimed(
    deps: &Deps,
    turn: ClaimedTurn,
    shutdown: &CancellationToken,
) -> queue::Result<Outcome> {
    info!("claimed");
    let abort = Arc::new(AtomicBool::new(false));
    let keeper = LeaseKeeper::spawn(deps, &turn, abort.clone(), shutdown.clone());
    let result = deps.generator.run_turn(deps, &turn, abort.clone()).await;
    keeper.stop();
    match result {
        Ok((reply, log)) => finish_ok(deps, &turn, &reply, log).await,
        Err(TurnError::Aborted) if shutdown.is_cancelled() => {
            queue::release(&deps.pool, &turn).await?;
            info!("released on shutdown");
            Ok(Outcome::Released(turn.id))
        }
        Err(err) => finish_err(deps, &turn, err).await,
    }
}

async fn finish_ok(
    deps: &Deps,
    turn: &ClaimedTurn,
    reply: &str,
    mut log: KvLog,
) -> queue::Result<Outcome> {
    log.finish();
    match queue::complete(&deps.pool, turn, reply, &log).await {
        Ok(()) => {
            log.emit();
            crate::metrics::global().turn(&log);
            info!(latency_ms = log.latency_ms, "completed");
            deps.generator.after_turn(deps, turn).await;
            Ok(Outcome::Done(turn.id))
        }
        Err(QueueError::Fenced(id)) => {
            warn!("completion rejected: lease lost");
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
                deps.generator.path(&deps.settings),
                &turn.session_id,
                deps.settings.n_ctx,
            )
        })
        .failed(&message);
    log.finish();
    log.emit();
    crate::metrics::global().turn(&log);
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

/// Heartbeats the lease while a turn runs. Sets `abort` when the lease is lost, or when
/// shutdown has waited its grace period, so a generation in flight stops early.
struct LeaseKeeper {
    stop: CancellationToken,
}

impl LeaseKeeper {
    fn spawn(
        deps: &Deps,
        turn: &ClaimedTurn,
        abort: Arc<AtomicBool>,
        shutdown: CancellationToken,
    ) -> LeaseKeeper {
        let stop = CancellationToken::new();
        let (pool, turn, settings, stop2) = (
            deps.pool.clone(),
            turn.clone(),
            deps.settings.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let beat = Duration::from_millis(settings.heartbeat_ms);
            let grace = Duration::from_millis(settings.shutdown_grace_ms);
            let grace_over = async {
                shutdown.cancelled().await;
                tokio::time::sleep(grace).await;
            };
            tokio::pin!(grace_over);
            loop {
                tokio::select! {
                    _ = stop2.cancelled() => return,
                    _ = &mut grace_over => {
                        abort.store(true, Ordering::Relaxed);
                        return;
                    }
                    _ = tokio::time::sleep(beat) => {}
                }
                match queue::heartbeat(&pool, &turn, settings.lease_ms).await {
                    Ok(true) => {}
                    Ok(false) => {
                        warn!(turn_id = %turn.id, "lease lost; aborting the turn");
                        abort.store(true, Ordering::Relaxed);
                        return;
                    }
                    // A database blip: keep trying until the lease would run out.
                    Err(e) => warn!(turn_id = %turn.id, error = %e, "heartbeat failed"),
                }
            }
        });
        LeaseKeeper { stop }
    }

    fn stop(self) {
        self.stop.cancel();
    }
}

/// Runs the claim loop with `settings.concurrency` turns at a time until `shutdown`.
pub async fn run(deps: Deps, shutdown: CancellationToken) {
    let wake = Arc::new(Notify::new());
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(listen_for_turns(
        deps.clone(),
        wake.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(reaper(deps.clone(), wake.clone(), shutdown.clone()));
    deps.generator
        .spawn_background(&deps, &mut tasks, shutdown.clone());
    for slot in 0..deps.settings.concurrency {
        let (deps, wake, shutdown) = (deps.clone(), wake.clone(), shutdown.clone());
        tasks.spawn(async move { claim_loop(slot, deps, wake, shutdown).await });
    }
    info!(worker_id = %deps.worker_id, concurrency = deps.settings.concurrency, "worker started");
    while tasks.join_next().await.is_some() {}
    info!("worker stopped");
}

async fn claim_loop(slot: u32, deps: Deps, wake: Arc<Notify>, shutdown: CancellationToken) {
    let poll = Duration::from_millis(deps.settings.poll_ms);
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match process_next_turn(&deps, &shutdown).await {
            Ok(Outcome::Empty) => {
                failures = 0;
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = &mut notified => {}
                    _ = tokio::time::sleep(poll) => {}
                }
            }
            Ok(_) => failures = 0,
            Err(e) => {
                failures = (failures + 1).min(8);
                let backoff = Duration::from_millis(50 << failures);
                error!(slot, error = %e, backoff_ms = backoff.as_millis() as u64, "claim loop error");
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(backoff) => {}
                }
            }
        }
    }
}

/// Turns NOTIFY on enqueue into wake-ups; the poll in [`claim_loop`] covers any gap.
async fn listen_for_turns(deps: Deps, wake: Arc<Notify>, shutdown: CancellationToken) {
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        match listen_once(&deps.pool, &wake, &shutdown).await {
            Ok(()) => return,
            Err(e) => {
                failures = (failures + 1).min(8);
                warn!(error = %e, "turn listener lost; reconnecting");
                // Anything enqueued while we were away is found by the claim loop's poll.
                wake.notify_waiters();
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(50 << failures)) => {}
                }
            }
        }
    }
}

async fn listen_once(
    pool: &PgPool,
    wake: &Notify,
    shutdown: &CancellationToken,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(queue::TURNS_CHANNEL).await?;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            n = listener.try_recv() => match n? {
                Some(_) => wake.notify_one(),
                // The connection dropped and was re-established: we may have missed wake-ups.
                None => wake.notify_waiters(),
            }
        }
    }
}

async fn reaper(deps: Deps, wake: Arc<Notify>, shutdown: CancellationToken) {
    let every = Duration::from_millis(deps.settings.reaper_ms);
    while !shutdown.is_cancelled() {
        match queue::reap(&deps.pool).await {
            Ok(reaped) if !reaped.is_empty() => {
                crate::metrics::global().reaped(reaped.len());
                for r in &reaped {
                    warn!(turn_id = %r.turn_id, sid = %r.session_id, state = ?r.state, "reaped expired lease");
                }
                wake.notify_waiters();
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "reaper failed"),
        }
        if let Err(e) = queue::trim_events(&deps.pool, deps.settings.events_retention_hours).await {
            warn!(error = %e, "event retention failed");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
