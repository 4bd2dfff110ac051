//! `kvmem worker`, and the worker the serve and replay commands run in their own process:
//! the generator chosen on the command line, the model loaded once, and a clean stop on
//! SIGTERM or SIGINT.

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use tokio_util::sync::CancellationToken;

use super::error::CommandError;
use crate::config::Settings;
use crate::engine::Placement;
use crate::runner::{self, Deps, WorkerError};
use crate::snapshot::SnapshotStore;
use crate::system::{self, Model, SystemError};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum GeneratorKind {
    /// The turn pipeline on the model at KVMEM_MODEL_PATH.
    Llama,
    /// Queue-test and benchmark generator: replies `echo: <message>`, loads no model.
    Echo,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long, value_enum, default_value = "llama")]
    generator: GeneratorKind,
    /// Turns in flight at once (overrides KVMEM_CONCURRENCY).
    #[arg(long)]
    concurrency: Option<u32>,
    /// Echo generator only: how long each reply takes, to simulate work.
    #[arg(long, default_value_t = 0)]
    echo_delay_ms: u64,
}

/// `kvmem worker`: claims and runs turns until SIGTERM or SIGINT.
pub async fn run(args: WorkerArgs, mut settings: Settings) -> Result<(), CommandError> {
    if let Some(c) = args.concurrency {
        settings.queue.concurrency = c;
    }
    // Signals first: a SIGTERM while connecting or loading the model is a clean exit too.
    let shutdown = shutdown_on_signal();
    let settings = Arc::new(settings);
    let connections = settings.queue.concurrency + 4;
    let ready = system::database_when_ready(&settings, connections, &shutdown).await;
    let Some(pool) = ready.map_err(CommandError::Start)? else {
        tracing::info!("stopped before the database was reachable");
        return Ok(());
    };
    let deps = build_deps(settings, pool, args.generator, args.echo_delay_ms).await?;
    runner::run(deps, shutdown).await?;
    Ok(())
}

/// The worker's dependencies: the pool and the chosen generator (model loaded once).
async fn build_deps(
    settings: Arc<Settings>,
    pool: sqlx::PgPool,
    kind: GeneratorKind,
    echo_delay_ms: u64,
) -> Result<Deps, SystemError> {
    let model = match kind {
        GeneratorKind::Echo => Model::Echo {
            delay: Duration::from_millis(echo_delay_ms),
        },
        GeneratorKind::Llama => Model::Llama(system::load_model(&settings).await?),
    };
    let id = runner::new_worker_id();
    system::deps(pool, settings, model, id, crate::metrics::global())
}

type WorkerTask = tokio::task::JoinHandle<Result<(), WorkerError>>;

/// The in-process worker of `kvmem serve` and `kvmem replay` (none when told not to), its
/// snapshot store, and where its model runs.
pub struct InProcess {
    pub worker: Option<WorkerTask>,
    pub snapshots: SnapshotStore,
    pub placement: Option<Placement>,
}

/// A worker in this process unless `no_worker`, stopping on `shutdown`.
pub async fn in_process(
    no_worker: bool,
    settings: &Arc<Settings>,
    pool: &sqlx::PgPool,
    generator: GeneratorKind,
    shutdown: &CancellationToken,
) -> Result<InProcess, SystemError> {
    if no_worker {
        let snapshots = system::snapshot_store(settings, &crate::metrics::global())?;
        return Ok(InProcess {
            worker: None,
            snapshots,
            placement: None,
        });
    }
    let deps = build_deps(settings.clone(), pool.clone(), generator, 0).await?;
    // The worker's own store, so its cache index sees what `/v1/erase` removes.
    let snapshots = match &deps.snapshots {
        Some(store) => store.clone(),
        None => system::snapshot_store(settings, &deps.metrics)?,
    };
    let placement = deps.placement().cloned();
    Ok(InProcess {
        worker: Some(tokio::spawn(runner::run(deps, shutdown.clone()))),
        snapshots,
        placement,
    })
}

/// A token cancelled on SIGTERM or SIGINT.
pub fn shutdown_on_signal() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested: finishing or releasing turns in flight");
        signals.cancel();
    });
    shutdown
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
