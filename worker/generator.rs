//! What produces a reply: the real turn pipeline on llama.cpp, or the echo generator that
//! queue-mechanics tests and benchmarks use to exercise the queue without a model.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::kvlog::{KvLog, TurnPath};
use crate::pipeline::TurnPipeline;
use crate::queue::ClaimedTurn;
use crate::worker::Deps;

/// A failed turn attempt, classified once: the queue retries only what may succeed later.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// Bad input that no retry can fix (a message too long for the context, say).
    #[error("{message}")]
    Fatal {
        message: String,
        log: Option<Box<KvLog>>,
    },
    /// A database blip or an engine failure: worth another attempt after backoff.
    #[error("{message}")]
    Retryable {
        message: String,
        log: Option<Box<KvLog>>,
    },
    /// Stopped early: the lease was lost or shutdown ran out of grace.
    #[error("turn aborted: lease lost or shutting down")]
    Aborted,
}

impl TurnError {
    pub fn fatal(message: impl Into<String>) -> TurnError {
        TurnError::Fatal {
            message: message.into(),
            log: None,
        }
    }

    pub fn retryable(message: impl Into<String>) -> TurnError {
        TurnError::Retryable {
            message: message.into(),
            log: None,
        }
    }

    /// Attaches the partial log, so the failed attempt's row shows how far it got.
    pub fn with_log(self, partial: KvLog) -> TurnError {
        match self {
            TurnError::Fatal { message, .. } => TurnError::Fatal {
                message,
                log: Some(Box::new(partial)),
            },
            TurnError::Retryable { message, .. } => TurnError::Retryable {
                message,
                log: Some(Box::new(partial)),
            },
            TurnError::Aborted => TurnError::Aborted,
        }
    }

    pub fn is_retryable(&self) -> bool {
        !matches!(self, TurnError::Fatal { .. })
    }

    pub fn log(&self) -> Option<KvLog> {
        match self {
            TurnError::Fatal { log, .. } | TurnError::Retryable { log, .. } => {
                log.as_deref().cloned()
            }
            TurnError::Aborted => None,
        }
    }
}

impl From<sqlx::Error> for TurnError {
    fn from(e: sqlx::Error) -> TurnError {
        TurnError::retryable(format!("database: {e}"))
    }
}

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
    ) -> Result<(String, KvLog), TurnError> {
        match self {
            Generator::Echo { delay } => echo(deps, turn, *delay, &abort).await,
            Generator::Llama(pipeline) => pipeline.run_turn(deps, turn, abort).await,
        }
    }

    /// Seed step 6, after the turn committed: rebuild the session's digest.
    pub async fn after_turn(&self, deps: &Deps, turn: &ClaimedTurn) {
        if let Generator::Llama(pipeline) = self {
            pipeline.after_turn(deps, turn).await;
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
            Generator::Llama(pipeline) => pipeline.spawn_background(deps, tasks, shutdown),
            // Digests are a database feature: they stay fresh whatever the generator is.
            Generator::Echo { .. } => {
                tasks.spawn(crate::digest::run_rebuilder(
                    deps.pool.clone(),
                    Arc::new(crate::tokens::WordCount),
                    deps.settings.digest_max_tokens as usize,
                    Duration::from_millis(deps.settings.poll_ms.max(100)),
                    deps.metrics.clone(),
                    shutdown,
                ));
            }
        }
    }

    /// The `path=` this generator logs.
    pub fn path(&self, settings: &Settings) -> TurnPath {
        match self {
            Generator::Echo { .. } => TurnPath::Echo,
            Generator::Llama(_) if settings.kv_only_enabled => TurnPath::KvOnly,
            Generator::Llama(_) => TurnPath::Rollback,
        }
    }
}

async fn echo(
    deps: &Deps,
    turn: &ClaimedTurn,
    delay: Duration,
    abort: &AtomicBool,
) -> Result<(String, KvLog), TurnError> {
    let mut log = KvLog::start(TurnPath::Echo, &turn.session_id, deps.settings.n_ctx);
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
    Ok((format!("echo: {}", turn.message), log))
}
