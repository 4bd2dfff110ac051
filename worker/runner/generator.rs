//! What a worker's turns run with: its dependencies, and what produces a reply (the real
//! turn pipeline on llama.cpp, or the echo generator that queue-mechanics tests and
//! benchmarks use to exercise the queue without a model).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::engine::Engine;
use crate::pipeline::TurnPipeline;
use crate::queue::QueueTiming;
use crate::snapshot::SnapshotStore;
use crate::turn::log::{FinishReason, KvLog, TurnPath};
use crate::turn::{ClaimedTurn, Lease, TurnError, TurnOutput};

/// What a turn needs; cheap to clone.
#[derive(Clone)]
pub struct Deps {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    pub generator: Arc<dyn Generator>,
    /// The chat model, when the generator runs one: the lanes share its weights.
    pub engine: Option<Arc<Engine>>,
    /// The snapshot store the turns write; none for the echo generator.
    pub snapshots: Option<SnapshotStore>,
    pub worker_id: String,
    /// Where this worker counts (the process-wide registry outside tests).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// What the lanes build their services with (the composition root's).
    pub services: Arc<dyn crate::services::Services>,
}

impl Deps {
    pub(super) fn timing(&self) -> QueueTiming {
        QueueTiming {
            lease_ms: self.settings.queue.lease_ms,
            backoff_base_ms: self.settings.queue.backoff_base_ms,
            backoff_max_ms: self.settings.queue.backoff_max_ms,
        }
    }
}

/// What produces a turn's reply. The worker drives every generator the same way; what
/// differs between them stays behind this trait.
pub trait Generator: Send + Sync {
    /// Steps 2–6 of a claimed turn (load, prune, build, generate, save): its work up to
    /// (not including) the fenced completion, while `lease` is held.
    fn run_turn<'a>(
        &'a self,
        deps: &'a Deps,
        turn: &'a ClaimedTurn,
        lease: &'a Lease,
    ) -> BoxFuture<'a, Result<TurnOutput, TurnError>>;

    /// Step 8, after the turn committed: rebuild the session's digest.
    fn after_turn<'a>(&'a self, turn: &'a ClaimedTurn) -> BoxFuture<'a, ()>;

    /// Background work the generator needs while the worker runs (digest rebuilds).
    fn spawn_background(&self, deps: &Deps, tasks: &mut JoinSet<()>, shutdown: CancellationToken);

    /// The `path=` this generator logs.
    fn path(&self) -> TurnPath;
}

/// Seed 000's turn pipeline on a local model.
impl Generator for TurnPipeline {
    fn run_turn<'a>(
        &'a self,
        _deps: &'a Deps,
        turn: &'a ClaimedTurn,
        lease: &'a Lease,
    ) -> BoxFuture<'a, Result<TurnOutput, TurnError>> {
        Box::pin(TurnPipeline::run_turn(self, turn, lease))
    }

    fn after_turn<'a>(&'a self, turn: &'a ClaimedTurn) -> BoxFuture<'a, ()> {
        Box::pin(TurnPipeline::after_turn(self, turn))
    }

    fn spawn_background(&self, _deps: &Deps, tasks: &mut JoinSet<()>, shutdown: CancellationToken) {
        TurnPipeline::spawn_background(self, tasks, shutdown)
    }

    fn path(&self) -> TurnPath {
        TurnPipeline::path(self)
    }
}

/// Queue-test and benchmark generator: replies `echo: <message>` after `delay`. It loads
/// no model and writes no snapshot.
pub struct Echo {
    pub delay: Duration,
}

impl Generator for Echo {
    fn run_turn<'a>(
        &'a self,
        deps: &'a Deps,
        turn: &'a ClaimedTurn,
        lease: &'a Lease,
    ) -> BoxFuture<'a, Result<TurnOutput, TurnError>> {
        Box::pin(async move { echo(deps, turn, self.delay, lease.abort_flag()).await })
    }

    fn after_turn<'a>(&'a self, _turn: &'a ClaimedTurn) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    // Digests are a database feature: they stay fresh whatever the generator is.
    fn spawn_background(&self, deps: &Deps, tasks: &mut JoinSet<()>, shutdown: CancellationToken) {
        tasks.spawn(crate::context::digest::run_rebuilder(
            deps.pool.clone(),
            Arc::new(crate::context::tokens::WordCount),
            deps.settings.turn.digest_max_tokens as usize,
            Duration::from_millis(deps.settings.queue.poll_ms.max(100)),
            deps.metrics.clone(),
            shutdown,
        ));
    }

    fn path(&self) -> TurnPath {
        TurnPath::Echo
    }
}

impl Deps {
    /// After a turn lost its fence: a snapshot it wrote for a session erased meanwhile is
    /// removed now, not at the next sweep.
    pub async fn after_fenced(&self, turn: &ClaimedTurn) {
        let Some(store) = &self.snapshots else {
            return;
        };
        let scope = crate::snapshot::scope_key(&turn.user_id, turn.character_id, &turn.session_id);
        match crate::erase::after_fenced(&self.pool, store, &scope).await {
            Ok(true) => {
                tracing::info!("the session was erased while its turn ran; its snapshot is removed")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not check whether the session was erased; the sweep will")
            }
        }
    }

    /// What this worker's housekeeping works with.
    pub fn housekeeping(&self) -> crate::maintenance::Housekeeping {
        crate::maintenance::Housekeeping {
            pool: self.pool.clone(),
            settings: self.settings.clone(),
            metrics: self.metrics.clone(),
            snapshots: self.snapshots.clone(),
        }
    }

    /// The claim-affinity wait, when claims should prefer sessions this worker ran last:
    /// only when snapshots live in an object store, so that the local cache is what the
    /// preference buys. With local snapshots every worker of the host reads the same files.
    pub fn claim_affinity(&self) -> Option<Duration> {
        let queue = &self.settings.queue;
        let remote = self.snapshots.as_ref()?.remote_url().is_some();
        (queue.claim_affinity && remote).then(|| Duration::from_millis(queue.affinity_wait_ms))
    }

    /// Where the chat model runs, if this worker has one.
    pub fn placement(&self) -> Option<&crate::engine::Placement> {
        self.engine.as_ref().map(|engine| &engine.placement)
    }
}

async fn echo(
    deps: &Deps,
    turn: &ClaimedTurn,
    delay: Duration,
    abort: &AtomicBool,
) -> Result<TurnOutput, TurnError> {
    let mut log = KvLog::start(TurnPath::Echo, &turn.session_id, deps.settings.engine.n_ctx);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if abort.load(Ordering::Relaxed) {
        return Err(TurnError::Aborted);
    }
    // A test hook, labelled as such: messages starting with this marker fail, so retry
    // and dead-letter paths can be driven through the real queue.
    if let Some(rest) = turn.message.strip_prefix("echo-fail:") {
        return Err(TurnError::retryable(format!(
            "echo generator asked to fail: {rest}"
        )));
    }
    log.u_tokens = turn.message.split_whitespace().count() as u32;
    log.r_tokens = log.u_tokens + 1;
    log.finish_reason = Some(FinishReason::Stop);
    Ok(TurnOutput {
        reply: format!("echo: {}", turn.message),
        log,
        kv: None,
        memory_ops: Vec::new(),
    })
}
