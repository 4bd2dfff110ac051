//! The `kvmem` command: migrate, run the worker, enqueue by hand, and watch the queue.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use kvmem::cmd::status;
use kvmem::config::Settings;
use kvmem::runner::{self, Deps};
use kvmem::snapshot::SnapshotStore;
use kvmem::system::{self, Model};
use kvmem::{db, queue, telemetry};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "kvmem",
    version,
    about = "Durable memory for LLM chat characters: a Postgres turn queue with llama.cpp KV snapshots"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum GeneratorKind {
    /// The turn pipeline on the model at KVMEM_MODEL_PATH.
    Llama,
    /// Queue-test and benchmark generator: replies `echo: <message>`, loads no model.
    Echo,
}

/// Whether a command writes is part of its help: a command that writes migrates the
/// database first (`kvmem migrate` does nothing else), one that only reads never migrates
/// and refuses a schema behind this binary.
#[derive(Subcommand)]
enum Command {
    /// Apply migrations and (re)install the SQL API and views. Writes: it is the upgrade.
    /// On a schema a newer release migrated with additive migrations only it changes
    /// nothing; on one with any other newer migration it refuses.
    Migrate {
        /// Only list the applied, pending and newer migrations. Read-only.
        #[arg(long)]
        status: bool,
    },
    /// Run the claim loop until SIGTERM/SIGINT. Writes: migrates at start (waiting for the
    /// database while it is down), then answers queued turns.
    Worker(WorkerArgs),
    /// Queue one turn, as a backend would with `SELECT kvmem_enqueue_turn(...)`. Writes:
    /// migrates first.
    Enqueue(EnqueueArgs),
    /// A 10-turn scene on SmolLM2: throwaway Postgres if DATABASE_URL is unset,
    /// real queue and worker, then a summary table. Uses config/demo.toml.
    /// Writes. With DATABASE_URL set it migrates that database and runs a full worker on
    /// it, which claims any turn queued there: it refuses a database that holds turns
    /// unless given --force.
    Demo {
        /// `memory`: a session closes, is summarised, and the next one opens with it.
        #[arg(long, value_enum, default_value = "runbook")]
        scene: kvmem::cmd::demo::Scene,
        /// Run on a DATABASE_URL whose database already holds turns (its queued ones get
        /// answered by the demo's worker).
        #[arg(long)]
        force: bool,
    },
    /// The HTTP API (OpenAI-style chat completions, rotate-hint, info, metrics), with
    /// a worker in the same process unless --no-worker. Writes: migrates at start (waiting
    /// for the database while it is down) and queues the turns it is sent.
    Serve(ServeArgs),
    /// Re-run recorded sessions into new sessions on the replay lane and compare replies.
    /// Writes: migrates first and queues the replayed turns.
    Replay(ReplayArgs),
    /// Build a session's digest from its facts and print its version and text. Read-only
    /// unless --store.
    Digest {
        #[arg(long)]
        session: String,
        /// Also store it in state_digest (as the rebuilder would). Writes: migrates first.
        #[arg(long)]
        store: bool,
    },
    /// Long-term memory: import, search, show, remember, forget, cards, journal, snapshot.
    /// Each subcommand's help says whether it writes.
    Memory(kvmem::cmd::memory::MemoryArgs),
    /// Summaries: show, rebuild, work, context, export/import of a context document.
    /// Each subcommand's help says whether it writes.
    Summary(kvmem::cmd::summary::SummaryArgs),
    /// Erase a user, a character or a session everywhere. Writes: deletes; idempotent.
    Erase(kvmem::cmd::erase::EraseArgs),
    /// Characters without SQL: add (public or one user's), list, edit, remove.
    Character(kvmem::cmd::character::CharacterArgs),
    /// Per-user API keys for `http.identity = "key"`: create (printed once), list, revoke.
    Keys(kvmem::cmd::keys::KeysArgs),
    /// Counts by state, oldest queued age, running sessions, dead turns. Read-only.
    Status {
        /// Refresh every N seconds.
        #[arg(long, value_name = "SECS")]
        watch: Option<u64>,
    },
}

#[derive(Args)]
struct WorkerArgs {
    #[arg(long, value_enum, default_value = "llama")]
    generator: GeneratorKind,
    /// Turns in flight at once (overrides KVMEM_CONCURRENCY).
    #[arg(long)]
    concurrency: Option<u32>,
    /// Echo generator only: how long each reply takes, to simulate work.
    #[arg(long, default_value_t = 0)]
    echo_delay_ms: u64,
}

#[derive(Args)]
struct EnqueueArgs {
    #[arg(long)]
    session: String,
    #[arg(long)]
    user: String,
    #[arg(long)]
    character: i64,
    #[arg(long)]
    message: String,
    #[arg(long)]
    idempotency_key: Option<String>,
}

#[derive(Args)]
struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    #[arg(long)]
    no_worker: bool,
    #[arg(long, value_enum, default_value = "llama")]
    generator: GeneratorKind,
}

#[derive(Args)]
struct ReplayArgs {
    /// Recorded session ids (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    session: Vec<String>,
    /// A JSONL file of scenes: {"session_id","user_id","character_id","messages":[..],"replies":[..]}.
    #[arg(long)]
    scenes: Option<PathBuf>,
    /// Where to write the JSON report.
    #[arg(long, default_value = "replay-report.json")]
    report: PathBuf,
    /// Exit non-zero if any reply differs from the recorded one (or any turn fails).
    #[arg(long)]
    check: bool,
    /// Do not run a worker here (workers elsewhere take the replay lane).
    #[arg(long)]
    no_worker: bool,
    #[arg(long, value_enum, default_value = "llama")]
    generator: GeneratorKind,
    #[arg(long, default_value_t = 3600)]
    timeout_s: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let default_env = if matches!(cli.command, Command::Demo { .. }) {
        "demo"
    } else {
        "local"
    };
    let settings = Settings::load(default_env).context("loading configuration")?;
    telemetry::init(&settings);
    match cli.command {
        Command::Demo { scene, force } => Ok(kvmem::cmd::demo::run(settings, scene, force).await?),
        Command::Memory(args) => Ok(kvmem::cmd::memory::run(args, settings).await?),
        Command::Summary(args) => {
            let pool = system::connect(&settings, 4).await?;
            Ok(kvmem::cmd::summary::run(args, settings, pool).await?)
        }
        Command::Migrate { status } => migrate(&settings, status).await,
        Command::Worker(args) => worker(args, settings).await,
        Command::Enqueue(args) => enqueue(args, &settings).await,
        Command::Digest { session, store } => digest(&session, store, &settings).await,
        Command::Serve(args) => serve(args, settings).await,
        Command::Replay(args) => replay(args, settings).await,
        Command::Status { watch } => watch_status(watch, &settings).await,
        Command::Erase(args) => Ok(kvmem::cmd::erase::run(args, settings).await?),
        Command::Character(args) => Ok(kvmem::cmd::character::run(args, settings).await?),
        Command::Keys(args) => Ok(kvmem::cmd::keys::run(args, settings).await?),
    }
}

async fn migrate(settings: &Settings, status: bool) -> Result<()> {
    let pool = system::connect(settings, 2).await?;
    if status {
        print!("{}", kvmem::cmd::migrations::status(&pool).await?);
        return Ok(());
    }
    let done = db::migrate(&pool).await?;
    if done.newer.is_empty() {
        println!("migrated ({} applied)", done.applied.len());
    } else {
        println!(
            "nothing to do: the schema is newer than this binary ({} additive migration(s) of a \
             newer release); the SQL API and views stay the newer release's",
            done.newer.len()
        );
    }
    Ok(())
}

async fn worker(args: WorkerArgs, mut settings: Settings) -> Result<()> {
    if let Some(c) = args.concurrency {
        settings.queue.concurrency = c;
    }
    run_worker(settings, args.generator, args.echo_delay_ms).await
}

async fn enqueue(args: EnqueueArgs, settings: &Settings) -> Result<()> {
    let pool = system::database(settings, 1).await?;
    let id = queue::enqueue(
        &pool,
        &args.session,
        &args.user,
        args.character,
        &args.message,
        args.idempotency_key.as_deref(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{}", db_message(&e)))?;
    println!("{id}");
    Ok(())
}

async fn digest(session: &str, store: bool, settings: &Settings) -> Result<()> {
    let pool = if store {
        system::database(settings, 1).await?
    } else {
        system::connect_current(settings, 1, "digest").await?
    };
    let tok = token_counter(settings).await?;
    let max = settings.turn.digest_max_tokens as usize;
    let built = if store {
        let metrics = kvmem::metrics::global();
        kvmem::context::digest::rebuild(&pool, session, max, tok.as_ref(), &metrics)
            .await?
            .0
    } else {
        kvmem::context::digest::build_for(&pool, session, max, tok.as_ref()).await?
    };
    println!("{}\n{}", built.version, built.content);
    Ok(())
}

/// A worker in this process unless `no_worker`: the serve and replay commands' own.
async fn in_process_worker(
    no_worker: bool,
    settings: &Arc<Settings>,
    pool: &sqlx::PgPool,
    generator: GeneratorKind,
    shutdown: &CancellationToken,
) -> Result<InProcess> {
    if no_worker {
        let store = system::snapshot_store(settings, &kvmem::metrics::global())?;
        return Ok((None, store, None));
    }
    let deps = build_deps(settings.clone(), pool.clone(), generator, 0).await?;
    // The worker's own store, so its cache index sees what `/v1/erase` removes.
    let store = match deps.generator.snapshots() {
        Some(store) => store.clone(),
        None => system::snapshot_store(settings, &deps.metrics)?,
    };
    let placement = deps.generator.placement().cloned();
    Ok((
        Some(tokio::spawn(runner::run(deps, shutdown.clone()))),
        store,
        placement,
    ))
}

type WorkerTask = tokio::task::JoinHandle<Result<(), runner::WorkerError>>;
/// The in-process worker (none with `--no-worker`), its snapshot store, and where its
/// model runs.
type InProcess = (
    Option<WorkerTask>,
    SnapshotStore,
    Option<kvmem::engine::Placement>,
);

async fn serve(args: ServeArgs, settings: Settings) -> Result<()> {
    let listen = args.listen;
    // Before anything is loaded: an exposed server without a token must not start.
    let addr: std::net::SocketAddr = tokio::net::lookup_host(&listen)
        .await
        .with_context(|| format!("resolving {listen}"))?
        .next()
        .with_context(|| format!("{listen} resolves to no address"))?;
    kvmem::http::check_exposure(&addr, &settings)?;
    let settings = Arc::new(settings);
    // Signals first, as for `kvmem worker`: a SIGTERM while waiting for the database is a
    // clean exit.
    let shutdown = shutdown_on_signal();
    let Some(pool) =
        system::database_when_ready(&settings, settings.queue.concurrency + 8, &shutdown)
            .await
            .context("connecting and migrating before start")?
    else {
        tracing::info!("stopped before the database was reachable");
        return Ok(());
    };
    let (worker, snapshots, chat_placement) =
        in_process_worker(args.no_worker, &settings, &pool, args.generator, &shutdown).await?;
    let model_sha = match &settings.engine.model_path {
        Some(p) => kvmem::engine::file_sha256(p).unwrap_or_default(),
        None => String::new(),
    };
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    tracing::info!(%listen, "kvserver listening");
    let memory = system::memory_service(pool.clone(), &settings, true).await?;
    let mut state = kvmem::http::AppState::new(pool, settings, model_sha);
    if let Some(p) = chat_placement {
        state = state.with_placement("chat", p);
    }
    if let Some(e) = &memory.embedder {
        state = state.with_placement("embedder", e.placement.clone());
    }
    let state = state
        .with_memory(Arc::new(memory))
        .with_snapshots(snapshots);
    let server = kvmem::http::serve(listener, state, shutdown.clone());
    let Some(mut worker) = worker else {
        return Ok(server.await?);
    };
    tokio::pin!(server);
    // The in-process worker ending before shutdown means no turn will ever finish:
    // stop serving and exit non-zero rather than answer 504 forever.
    tokio::select! {
        served = &mut server => {
            served?;
            worker.await.context("in-process worker")??;
            Ok(())
        }
        ended = &mut worker => {
            // On a signal the worker may finish first: that is a clean stop.
            let asked = shutdown.is_cancelled();
            shutdown.cancel();
            server.await?;
            ended.context("in-process worker")??;
            if asked {
                return Ok(());
            }
            anyhow::bail!("the in-process worker stopped while the server was still serving");
        }
    }
}

async fn replay(args: ReplayArgs, settings: Settings) -> Result<()> {
    let mut replay_settings = settings;
    replay_settings.queue.lanes = vec!["replay".into()];
    let settings = Arc::new(replay_settings);
    let pool = system::database(&settings, settings.queue.concurrency + 4).await?;
    let mut all = kvmem::cmd::replay::scenes_from_db(&pool, &args.session).await?;
    if let Some(path) = &args.scenes {
        all.extend(kvmem::cmd::replay::scenes_from_jsonl(path)?);
    }
    anyhow::ensure!(
        !all.is_empty(),
        "nothing to replay: give --session or --scenes"
    );
    let shutdown = CancellationToken::new();
    let (worker, _, _) =
        in_process_worker(args.no_worker, &settings, &pool, args.generator, &shutdown).await?;
    let run_id = chrono::Utc::now().format("%Y%m%dT%H%M%S%3f").to_string();
    let timeout = Duration::from_secs(args.timeout_s);
    let result = kvmem::cmd::replay::run(&pool, &all, &run_id, timeout, true).await;
    shutdown.cancel();
    if let Some(w) = worker {
        let _ = w.await;
    }
    let result = result?;
    std::fs::write(&args.report, serde_json::to_string_pretty(&result)?)?;
    print!("{}", kvmem::cmd::replay::summary(&result));
    println!("report: {}", args.report.display());
    if args.check && (result.divergences > 0 || result.failures > 0) {
        anyhow::bail!(
            "replay check failed: {} diverged, {} failed",
            result.divergences,
            result.failures
        );
    }
    Ok(())
}

async fn watch_status(watch: Option<u64>, settings: &Settings) -> Result<()> {
    let pool = system::connect_current(settings, 1, "status").await?;
    loop {
        let mut text = status::report(&pool).await?;
        text.push_str(&status::storage(&pool, &settings.snapshot.dir).await?);
        if watch.is_some() {
            print!("\x1b[2J\x1b[H");
        }
        print!("{text}");
        match watch {
            Some(secs) => tokio::time::sleep(Duration::from_secs(secs.max(1))).await,
            None => return Ok(()),
        }
    }
}

/// The database's own message for a raised error (our `kvmem: ...` texts), else the whole error.
fn db_message(e: &queue::QueueError) -> String {
    match e {
        queue::QueueError::Db(sqlx::Error::Database(d)) => d.message().to_string(),
        other => other.to_string(),
    }
}

/// The model's tokenizer when a model is configured, else the word counter.
async fn token_counter(settings: &Settings) -> Result<Arc<dyn kvmem::context::tokens::TokenCount>> {
    Ok(match &settings.engine.model_path {
        Some(_) => {
            system::load_model(settings).await? as Arc<dyn kvmem::context::tokens::TokenCount>
        }
        None => Arc::new(kvmem::context::tokens::WordCount),
    })
}

/// The worker's dependencies: the pool and the chosen generator (model loaded once).
async fn build_deps(
    settings: Arc<Settings>,
    pool: sqlx::PgPool,
    kind: GeneratorKind,
    echo_delay_ms: u64,
) -> Result<Deps> {
    let model = match kind {
        GeneratorKind::Echo => Model::Echo {
            delay: Duration::from_millis(echo_delay_ms),
        },
        GeneratorKind::Llama => Model::Llama(system::load_model(&settings).await?),
    };
    Ok(system::deps(
        pool,
        settings,
        model,
        runner::new_worker_id(),
        kvmem::metrics::global(),
    )?)
}

async fn run_worker(settings: Settings, kind: GeneratorKind, echo_delay_ms: u64) -> Result<()> {
    // Signals first: a SIGTERM while connecting or loading the model is a clean exit too.
    let shutdown = shutdown_on_signal();
    let settings = Arc::new(settings);
    let Some(pool) =
        system::database_when_ready(&settings, settings.queue.concurrency + 4, &shutdown)
            .await
            .context("connecting and migrating before start")?
    else {
        tracing::info!("stopped before the database was reachable");
        return Ok(());
    };
    let deps = build_deps(settings, pool, kind, echo_delay_ms).await?;
    runner::run(deps, shutdown).await?;
    Ok(())
}

/// A token cancelled on SIGTERM or SIGINT.
fn shutdown_on_signal() -> CancellationToken {
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
