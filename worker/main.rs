//! The `kvmem` command: parses the arguments, loads the settings and hands each command to
//! its function in `kvmem::cmd`.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kvmem::cmd::{self, queue};
use kvmem::config::Settings;
use kvmem::{system, telemetry};

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
    Worker(cmd::worker::WorkerArgs),
    /// Queue one turn, as a backend would with `SELECT kvmem_enqueue_turn(...)`. Writes:
    /// migrates first.
    Enqueue(queue::EnqueueArgs),
    /// A 10-turn scene on SmolLM2: throwaway Postgres if DATABASE_URL is unset,
    /// real queue and worker, then a summary table. Uses config/demo.toml.
    /// Writes. With DATABASE_URL set it migrates that database and runs a full worker on
    /// it, which claims any turn queued there: it refuses a database that holds turns
    /// unless given --force.
    Demo {
        /// `memory`: a session closes, is summarised, and the next one opens with it.
        #[arg(long, value_enum, default_value = "runbook")]
        scene: cmd::demo::Scene,
        /// Run on a DATABASE_URL whose database already holds turns (its queued ones get
        /// answered by the demo's worker).
        #[arg(long)]
        force: bool,
    },
    /// The HTTP API (OpenAI-style chat completions, rotate-hint, info, metrics), with
    /// a worker in the same process unless --no-worker. Writes: migrates at start (waiting
    /// for the database while it is down) and queues the turns it is sent.
    Serve(cmd::serve::ServeArgs),
    /// Re-run recorded sessions into new sessions on the replay lane and compare replies.
    /// Writes: migrates first and queues the replayed turns.
    Replay(cmd::replay_cli::ReplayArgs),
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
    Memory(cmd::memory::MemoryArgs),
    /// Summaries: show, rebuild, work, context, export/import of a context document.
    /// Each subcommand's help says whether it writes.
    Summary(cmd::summary::SummaryArgs),
    /// Erase a user, a character or a session everywhere. Writes: deletes; idempotent.
    Erase(cmd::erase::EraseArgs),
    /// Characters without SQL: add (public or one user's), list, edit, remove.
    Character(cmd::character::CharacterArgs),
    /// Per-user API keys for `http.identity = "key"`: create (printed once), list, revoke.
    Keys(cmd::keys::KeysArgs),
    /// Counts by state, oldest queued age, running sessions, dead turns. Read-only.
    Status {
        /// Refresh every N seconds.
        #[arg(long, value_name = "SECS")]
        watch: Option<u64>,
    },
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
        Command::Demo { scene, force } => cmd::demo::run(settings, scene, force).await?,
        Command::Memory(args) => cmd::memory::run(args, settings).await?,
        Command::Summary(args) => {
            let as_is = system::Role::AsIs { connections: 4 };
            let pool = system::build(settings.clone().into(), as_is).await?.pool;
            cmd::summary::run(args, settings, pool).await?
        }
        Command::Migrate { status } => queue::migrate(&settings, status).await?,
        Command::Worker(args) => cmd::worker::run(args, settings).await?,
        Command::Enqueue(args) => queue::enqueue(args, &settings).await?,
        Command::Digest { session, store } => queue::digest(&session, store, &settings).await?,
        Command::Serve(args) => cmd::serve::run(args, settings).await?,
        Command::Replay(args) => cmd::replay_cli::run(args, settings).await?,
        Command::Status { watch } => queue::watch_status(watch, &settings).await?,
        Command::Erase(args) => cmd::erase::run(args, settings).await?,
        Command::Character(args) => cmd::character::run(args, settings).await?,
        Command::Keys(args) => cmd::keys::run(args, settings).await?,
    }
    Ok(())
}
