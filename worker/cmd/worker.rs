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
use crate::system::{self, App, Model, Role, SystemError};

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
    let connections = settings.queue.concurrency + 4;
    let Some(app) = server(Arc::new(settings), connections, &shutdown).await? else {
        return Ok(());
    };
    let deps = build_deps(&app, args.generator, args.echo_delay_ms).await?;
    runner::run(deps, shutdown).await?;
    Ok(())
}

/// The system a long-running process (`kvmem worker`, `kvmem serve`) runs on, once the
/// database answers; `None` when a signal came first, which is a clean exit.
pub async fn server(
    settings: Arc<Settings>,
    connections: u32,
    shutdown: &CancellationToken,
) -> Result<Option<App>, CommandError> {
    let role = Role::Server {
        connections,
        shutdown,
    };
    match system::build(settings, role).await {
        Ok(app) => Ok(Some(app)),
        Err(SystemError::Stopped) => {
            tracing::info!("stopped before the database was reachable");
            Ok(None)
        }
        Err(e) => Err(CommandError::Start(e)),
    }
}

/// The worker's dependencies on `app`: the chosen generator (model loaded once).
async fn build_deps(
    app: &App,
    kind: GeneratorKind,
    echo_delay_ms: u64,
) -> Result<Deps, SystemError> {
    let model = match kind {
        GeneratorKind::Echo => Model::Echo {
            delay: Duration::from_millis(echo_delay_ms),
        },
        GeneratorKind::Llama => Model::Llama(system::load_model(&app.settings).await?),
    };
    app.deps(model, runner::new_worker_id())
}

type WorkerTask = tokio::task::JoinHandle<Result<(), WorkerError>>;

/// The in-process worker of `kvmem serve` and `kvmem replay` (none when told not to), and
/// where its model runs. It shares the app's snapshot store with the server, so its cache
/// index sees what `/v1/erase` removes.
pub struct InProcess {
    pub worker: Option<WorkerTask>,
    pub placement: Option<Placement>,
}

/// A worker in this process on `app` unless `no_worker`, stopping on `shutdown`.
pub async fn in_process(
    no_worker: bool,
    app: &App,
    generator: GeneratorKind,
    shutdown: &CancellationToken,
) -> Result<InProcess, SystemError> {
    if no_worker {
        return Ok(InProcess {
            worker: None,
            placement: None,
        });
    }
    let deps = build_deps(app, generator, 0).await?;
    let placement = deps.placement().cloned();
    Ok(InProcess {
        worker: Some(tokio::spawn(runner::run(deps, shutdown.clone()))),
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
