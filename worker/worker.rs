//! The worker: one turn is [`process_next_turn`], and the loop around it only waits for work,
//! reaps expired leases and stops on a signal.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn, Instrument};

use crate::config::Settings;
use crate::generator::{Generator, TurnError};
use crate::kvlog::KvLog;
use crate::queue::{self, ClaimedTurn, Completion, QueueError, QueueTiming, TurnId, TurnState};

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
    /// Where this worker counts (the process-wide registry outside tests).
    pub metrics: Arc<crate::metrics::Metrics>,
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
    let keeper = LeaseKeeper::spawn(deps, &turn, shutdown.clone());
    run_claimed(deps, turn, keeper, None, shutdown).await
}

/// What a turn started by [`run`] holds besides its lease: a generation slot, freed as
/// soon as the generation ends, and the group-commit queue for its completion.
struct Slot {
    permit: OwnedSemaphorePermit,
    freed: Arc<Notify>,
    completer: Completer,
}

async fn run_claimed(
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
            Ok((reply, log)) => finish_ok(deps, &turn, reply, log, completer.as_ref()).await,
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
    reply: String,
    mut log: KvLog,
    completer: Option<&Completer>,
) -> queue::Result<Outcome> {
    log.finish();
    let committed = match completer {
        Some(completer) => {
            completer
                .complete(Completion {
                    turn: turn.clone(),
                    reply,
                    log: log.clone(),
                })
                .await
        }
        None => queue::complete(&deps.pool, turn, &reply, &log).await,
    };
    match committed {
        Ok(()) => {
            log.emit();
            deps.metrics.turn(&log);
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
    abort: Arc<AtomicBool>,
}

impl LeaseKeeper {
    fn spawn(deps: &Deps, turn: &ClaimedTurn, shutdown: CancellationToken) -> LeaseKeeper {
        let stop = CancellationToken::new();
        let abort = Arc::new(AtomicBool::new(false));
        let abort2 = abort.clone();
        let (pool, turn, settings, stop2) = (
            deps.pool.clone(),
            turn.clone(),
            deps.settings.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let abort = abort2;
            let beat = Duration::from_millis(settings.heartbeat_ms);
            let grace = Duration::from_millis(settings.shutdown_grace_ms);
            let grace_over = async {
                shutdown.cancelled().await;
                tokio::time::sleep(grace).await;
            };
            tokio::pin!(grace_over);
            // Until when the lease is surely ours: the claim's expiry, then each heartbeat's.
            let lease = Duration::from_millis(settings.lease_ms);
            let mut held_until = tokio::time::Instant::now() + lease;
            loop {
                tokio::select! {
                    _ = stop2.cancelled() => return,
                    _ = &mut grace_over => {
                        abort.store(true, Ordering::Relaxed);
                        return;
                    }
                    _ = tokio::time::sleep(beat) => {}
                }
                let beat_started = tokio::time::Instant::now();
                match queue::heartbeat(&pool, &turn, settings.lease_ms).await {
                    Ok(true) => held_until = beat_started + lease,
                    Ok(false) => {
                        warn!(turn_id = %turn.id, "lease lost; aborting the turn");
                        abort.store(true, Ordering::Relaxed);
                        return;
                    }
                    // A database blip: keep trying while the lease is still ours. Once it
                    // may have run out, another worker may own the session: stop at once.
                    Err(e) if tokio::time::Instant::now() >= held_until => {
                        warn!(turn_id = %turn.id, error = %e, "heartbeat failed past the lease; aborting the turn");
                        abort.store(true, Ordering::Relaxed);
                        return;
                    }
                    Err(e) => warn!(turn_id = %turn.id, error = %e, "heartbeat failed"),
                }
            }
        });
        LeaseKeeper { stop, abort }
    }

    fn stop(self) {
        self.stop.cancel();
    }
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

/// Runs the worker until `shutdown`: `settings.concurrency` turns at a time, claimed in
/// batches and committed in groups. Returns an error, after stopping everything, if any
/// of its tasks ends before `shutdown`.
pub async fn run(deps: Deps, shutdown: CancellationToken) -> Result<(), WorkerError> {
    // The tasks stop on the caller's shutdown, or on this worker's own when one dies.
    let shutdown = shutdown.child_token();
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
    let (completer, committing) = Completer::spawn(
        deps.pool.clone(),
        deps.settings.complete_batch as usize,
        wake.clone(),
        deps.metrics.clone(),
    );
    let slots = Arc::new(Semaphore::new(deps.settings.concurrency as usize));
    if matches!(deps.generator, Generator::Llama(_)) && deps.settings.memory_lane {
        tasks.spawn(memory_lane(deps.clone(), slots.clone(), shutdown.clone()));
    }
    tasks.spawn(fetch_loop(
        deps.clone(),
        wake,
        completer,
        slots,
        shutdown.clone(),
    ));
    info!(
        worker_id = %deps.worker_id,
        concurrency = deps.settings.concurrency,
        claim_batch = deps.settings.claim_batch,
        complete_batch = deps.settings.complete_batch,
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

/// Claims turns for free slots (and up to `claim_batch` ahead) and starts them. It claims
/// again only when something can have become ready: a NOTIFY, a commit (the session's next
/// turn), the reaper, the poll timer, or a claim that filled every free place (there may be
/// more). A freed slot alone only starts a turn already claimed.
async fn fetch_loop(
    deps: Deps,
    wake: Arc<Notify>,
    completer: Completer,
    slots: Arc<Semaphore>,
    shutdown: CancellationToken,
) {
    let settings = deps.settings.clone();
    let capacity = settings.claim_batch.max(settings.concurrency) as usize;
    let poll = Duration::from_millis(settings.poll_ms);
    let mut waiting: VecDeque<(ClaimedTurn, LeaseKeeper)> = VecDeque::new();
    let mut running: JoinSet<queue::Result<Outcome>> = JoinSet::new();
    let freed = Arc::new(Notify::new());
    let mut claim_now = true;
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        crate::faults::panic_point("fetch_loop");
        while !waiting.is_empty() {
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                break;
            };
            let Some((turn, keeper)) = waiting.pop_front() else {
                break;
            };
            let slot = Slot {
                permit,
                freed: freed.clone(),
                completer: completer.clone(),
            };
            let (deps, shutdown) = (deps.clone(), shutdown.clone());
            running.spawn(
                async move { run_claimed(&deps, turn, keeper, Some(slot), &shutdown).await },
            );
        }
        while let Some(done) = running.try_join_next() {
            report(done);
        }
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let generating = settings.concurrency as usize - slots.available_permits();
        let want = capacity.saturating_sub(generating + waiting.len());
        // With a prefetch, top up in halves: claiming every freed place on its own would
        // turn one batched claim into a statement per turn.
        let worth_it = waiting.is_empty() || want >= (capacity / 2).max(1);
        if claim_now && want > 0 && worth_it {
            let claimed = queue::claim_up_to(
                &deps.pool,
                &deps.worker_id,
                settings.lease_ms,
                &settings.lanes,
                want as u32,
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
                    let backoff = Duration::from_millis(50 << failures);
                    error!(error = %e, backoff_ms = backoff.as_millis() as u64, "claim failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = tokio::time::sleep(backoff) => {}
                    }
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
    // Claimed but never started: back to the queue untouched.
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

/// The memory lane: embedding, extraction and remember/forget jobs queued after turns
/// commit. It takes a job only while none of this worker's turns is generating, so memory
/// work never stands between a live turn and its engine (a job already running finishes).
async fn memory_lane(deps: Deps, slots: Arc<Semaphore>, shutdown: CancellationToken) {
    let svc = match crate::memory::worker_service(deps.pool.clone(), &deps.settings).await {
        Ok(svc) => svc,
        Err(e) => {
            warn!(error = %e, "memory lane off: bad memory settings");
            shutdown.cancelled().await;
            return;
        }
    };
    let all = deps.settings.concurrency as usize;
    let rest = Duration::from_millis(deps.settings.poll_ms.max(100));
    let summary = crate::summary::worker_service(&deps).await;
    while !shutdown.is_cancelled() {
        let idle = slots.available_permits() == all;
        let worked = if idle {
            match crate::memory::jobs::process_next_memory_job(&svc).await {
                // Summaries (issue 14) run when the memory lane has nothing either.
                Ok(crate::memory::jobs::Outcome::Empty) => {
                    crate::summary::jobs::run_idle(summary.as_ref()).await
                }
                Ok(_) => true,
                Err(e) => {
                    warn!(error = %e, "memory job failed");
                    false
                }
            }
        } else {
            false
        };
        if !worked {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(rest) => {}
            }
        }
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

type Pending = (Completion, oneshot::Sender<queue::Result<()>>);

/// Group commit: finished turns queue here and are committed together, as many as are
/// waiting (up to `complete_batch`) per transaction, with no added delay.
#[derive(Clone)]
struct Completer {
    tx: mpsc::Sender<Pending>,
}

impl Completer {
    fn spawn(
        pool: PgPool,
        max: usize,
        wake: Arc<Notify>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> (Completer, tokio::task::JoinHandle<()>) {
        let max = max.max(1);
        let (tx, rx) = mpsc::channel(max * 2);
        let task = tokio::spawn(commit_loop(pool, max, rx, wake, metrics));
        (Completer { tx }, task)
    }

    async fn complete(&self, completion: Completion) -> queue::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send((completion, tx))
            .await
            .map_err(|_| QueueError::Stopped)?;
        rx.await.map_err(|_| QueueError::Stopped)?
    }
}

async fn commit_loop(
    pool: PgPool,
    max: usize,
    mut rx: mpsc::Receiver<Pending>,
    wake: Arc<Notify>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    while let Some(first) = rx.recv().await {
        let mut pending = vec![first];
        while pending.len() < max {
            match rx.try_recv() {
                Ok(next) => pending.push(next),
                Err(_) => break,
            }
        }
        let (batch, replies): (Vec<Completion>, Vec<_>) = pending.into_iter().unzip();
        let results = match queue::complete_many(&pool, &batch).await {
            Ok(results) => results,
            Err(e) => {
                // Nothing of the batch was written. One at a time, a single bad completion
                // (or a lock conflict) cannot hold back the others.
                warn!(error = %e, turns = batch.len(), "group commit failed; committing one by one");
                let mut results = Vec::with_capacity(batch.len());
                for c in &batch {
                    results.push(queue::complete(&pool, &c.turn, &c.reply, &c.log).await);
                }
                results
            }
        };
        metrics.commit_batch(batch.len());
        for (reply, result) in replies.into_iter().zip(results) {
            let _ = reply.send(result);
        }
        // Those sessions' next turns are claimable now.
        wake.notify_one();
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
                deps.metrics.reaped(reaped.len());
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
