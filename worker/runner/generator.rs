//! What a worker's turns run with: its dependencies, and what produces a reply (the real
//! turn pipeline on llama.cpp, or the echo generator that queue-mechanics tests and
//! benchmarks use to exercise the queue without a model).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::pipeline::TurnPipeline;
use crate::queue::QueueTiming;
use crate::turn::log::{FinishReason, KvLog, TurnPath};
use crate::turn::{ClaimedTurn, TurnError, TurnOutput};

/// What a turn needs; cheap to clone.
#[derive(Clone)]
pub struct Deps {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    pub generator: Generator,
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

/// How long an erased snapshot scope is remembered for the workers' sweeps: far longer
/// than any turn in flight, or a worker that was down, takes to sweep its directory.
pub const ERASED_SCOPES_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The reply generator a worker runs.
#[derive(Clone)]
pub enum Generator {
    /// Queue-test and benchmark generator: replies `echo: <message>` after `delay`.
    /// It loads no model and writes no snapshot.
    Echo { delay: Duration },
    /// Seed 000's turn pipeline on a local model.
    Llama(Arc<TurnPipeline>),
}

impl Generator {
    /// Runs one turn's work up to (not including) completion.
    pub async fn run_turn(
        &self,
        deps: &Deps,
        turn: &ClaimedTurn,
        abort: Arc<AtomicBool>,
    ) -> Result<TurnOutput, TurnError> {
        match self {
            Generator::Echo { delay } => echo(deps, turn, *delay, &abort).await,
            Generator::Llama(pipeline) => pipeline.run_turn(turn, abort).await,
        }
    }

    /// Seed step 6, after the turn committed: rebuild the session's digest.
    pub async fn after_turn(&self, turn: &ClaimedTurn) {
        if let Generator::Llama(pipeline) = self {
            pipeline.after_turn(turn).await;
        }
    }

    /// After a turn lost its fence: a snapshot it wrote for a session erased meanwhile is
    /// removed now, not at the next sweep.
    pub async fn after_fenced(&self, deps: &Deps, turn: &ClaimedTurn) {
        let Generator::Llama(pipeline) = self else {
            return;
        };
        let scope = crate::snapshot::scope_key(&turn.user_id, turn.character_id, &turn.session_id);
        match crate::erase::after_fenced(&deps.pool, &pipeline.store, &scope).await {
            Ok(true) => {
                tracing::info!("the session was erased while its turn ran; its snapshot is removed")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not check whether the session was erased; the sweep will")
            }
        }
    }

    /// Removes what this worker's snapshot store still holds of erased scopes, and forgets
    /// scopes erased longer than [`ERASED_SCOPES_KEPT`] ago.
    pub async fn sweep_erased(&self, deps: &Deps, mark: &mut crate::erase::SweepMark) {
        let Generator::Llama(pipeline) = self else {
            return;
        };
        match crate::erase::sweep(&deps.pool, &pipeline.store, ERASED_SCOPES_KEPT, mark).await {
            Ok(crate::erase::Swept { scopes, removed: r })
                if r.files + r.quarantined + r.objects > 0 =>
            {
                tracing::info!(
                    scopes,
                    files = r.files,
                    quarantined = r.quarantined,
                    objects = r.objects,
                    "removed snapshots of erased sessions"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "erased-snapshot sweep failed; it runs again"),
        }
    }

    /// Background work the generator needs while the worker runs (digest rebuilds).
    pub fn spawn_background(
        &self,
        deps: &Deps,
        tasks: &mut JoinSet<()>,
        shutdown: CancellationToken,
    ) {
        match self {
            Generator::Llama(pipeline) => pipeline.spawn_background(tasks, shutdown),
            // Digests are a database feature: they stay fresh whatever the generator is.
            Generator::Echo { .. } => {
                tasks.spawn(crate::context::digest::run_rebuilder(
                    deps.pool.clone(),
                    Arc::new(crate::context::tokens::WordCount),
                    deps.settings.turn.digest_max_tokens as usize,
                    Duration::from_millis(deps.settings.queue.poll_ms.max(100)),
                    deps.metrics.clone(),
                    shutdown,
                ));
            }
        }
    }

    /// The claim-affinity wait, when claims should prefer sessions this worker ran last:
    /// only when snapshots live in an object store, so that the local cache is what the
    /// preference buys. With local snapshots every worker of the host reads the same files.
    pub fn claim_affinity(&self) -> Option<Duration> {
        match self {
            Generator::Llama(pipeline) => {
                let queue = &pipeline.settings.queue;
                let remote = pipeline.store.remote_url().is_some();
                (queue.claim_affinity && remote)
                    .then(|| Duration::from_millis(queue.affinity_wait_ms))
            }
            _ => None,
        }
    }

    /// Where the chat model runs, if this generator has one.
    pub fn placement(&self) -> Option<&crate::engine::Placement> {
        match self {
            Generator::Llama(pipeline) => Some(&pipeline.engines.engine().placement),
            Generator::Echo { .. } => None,
        }
    }

    /// The snapshot store the turns use, if this generator writes snapshots.
    pub fn snapshots(&self) -> Option<&crate::snapshot::SnapshotStore> {
        match self {
            Generator::Llama(pipeline) => Some(&pipeline.store),
            Generator::Echo { .. } => None,
        }
    }

    /// The `path=` this generator logs.
    pub fn path(&self) -> TurnPath {
        match self {
            Generator::Echo { .. } => TurnPath::Echo,
            Generator::Llama(pipeline) => pipeline.path(),
        }
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
