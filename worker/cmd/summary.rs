//! `kvmem summary`: show what the summary layer holds for a user, queue a rebuild, run the
//! lane by hand, print the merged user context, and export or import a seed 003 context.

use std::fmt::Write;
use std::path::PathBuf;

use chrono::Utc;
use clap::{Args, Subcommand};
use serde_json::Value;
use sqlx::PgPool;

use crate::config::{ConfigError, Settings};
use crate::db::DbError;
use crate::summary::context_manager::{ContextError, ContextManager};
use crate::summary::report::{self, CharacterSummaries};
use crate::summary::{daily, jobs, SummaryError};

#[derive(Debug, thiserror::Error)]
pub enum SummaryCliError {
    #[error(transparent)]
    Summary(#[from] SummaryError),
    #[error(transparent)]
    Context(#[from] ContextError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = SummaryCliError> = std::result::Result<T, E>;

/// A read's error as these commands have always reported the database's: bare, without the
/// summary layer's "database:" prefix.
fn sql(e: SummaryError) -> SummaryCliError {
    match e {
        SummaryError::Db(e) => SummaryCliError::Sql(e),
        other => SummaryCliError::Summary(other),
    }
}

#[derive(Args)]
pub struct SummaryArgs {
    #[command(subcommand)]
    pub command: SummaryCommand,
}

#[derive(Subcommand)]
pub enum SummaryCommand {
    /// Session state, rolling summary, latest session summaries and the spine. Read-only;
    /// never migrates.
    Show {
        #[arg(long)]
        user: String,
        #[arg(long)]
        character: Option<i64>,
    },
    /// Queue new rolling, session and spine summaries for the user; `--run` also runs them.
    /// Writes: migrates first.
    Rebuild {
        #[arg(long)]
        user: String,
        #[arg(long)]
        character: Option<i64>,
        #[arg(long)]
        run: bool,
    },
    /// Run due summary jobs until none is left. Writes: migrates first.
    Work,
    /// The merged user context (facts + today + days 2–7). Read-only (it stores the day
    /// summaries it computes, as a cache); never migrates.
    Context {
        #[arg(long)]
        user: String,
        /// The guild; '' = direct chats.
        #[arg(long, default_value = "")]
        scope: String,
    },
    /// Write a session's context document (recent history, summary, facts) to a file.
    /// Read-only on the database; never migrates.
    Export {
        #[arg(long)]
        session: String,
        #[arg(long)]
        file: PathBuf,
    },
    /// Store a session's context document from a file. Writes: migrates first.
    Import {
        #[arg(long)]
        file: PathBuf,
    },
}

impl SummaryCommand {
    /// The subcommand as `kvmem summary <name>`, and whether it writes (so migrates first);
    /// one that only reads must find the schema current instead.
    fn name_and_writes(&self) -> (&'static str, bool) {
        match self {
            SummaryCommand::Show { .. } => ("summary show", false),
            SummaryCommand::Rebuild { .. } => ("summary rebuild", true),
            SummaryCommand::Work => ("summary work", true),
            SummaryCommand::Context { .. } => ("summary context", false),
            SummaryCommand::Export { .. } => ("summary export", false),
            SummaryCommand::Import { .. } => ("summary import", true),
        }
    }
}

/// Runs one `kvmem summary` command on `pool` (from [`crate::system::build`]): one that
/// writes migrates first, one that only reads refuses a schema behind this binary.
pub async fn run(args: SummaryArgs, settings: Settings, pool: PgPool) -> Result<()> {
    match args.command.name_and_writes() {
        (_, true) => {
            crate::db::migrate(&pool).await?;
        }
        (name, false) => {
            crate::db::require_current(&pool, name).await?;
        }
    }
    match args.command {
        SummaryCommand::Show { user, character } => {
            print!("{}", show(&pool, &user, character).await?);
            Ok(())
        }
        SummaryCommand::Rebuild {
            user,
            character,
            run,
        } => rebuild(&pool, &settings, &user, character, run).await,
        SummaryCommand::Work => work(&pool, &settings).await,
        SummaryCommand::Context { user, scope } => context(&pool, &settings, &user, &scope).await,
        SummaryCommand::Export { session, file } => export(pool, &session, &file).await,
        SummaryCommand::Import { file } => {
            let id = ContextManager::new(pool).import(&file).await?;
            println!("imported context {id}");
            Ok(())
        }
    }
}

/// Queues fresh summaries of everything the user has (one character or all), and with
/// `run` works them off here instead of waiting for a worker's idle lane.
async fn rebuild(
    pool: &PgPool,
    settings: &Settings,
    user: &str,
    character: Option<i64>,
    run: bool,
) -> Result<()> {
    check_user(user)?;
    let n = report::queue_rebuild(pool, user, character)
        .await
        .map_err(sql)?;
    println!("queued {n} summary jobs");
    if run {
        work(pool, settings).await?;
    }
    Ok(())
}

async fn context(pool: &PgPool, settings: &Settings, user: &str, scope: &str) -> Result<()> {
    check_user(user)?;
    let svc = crate::system::summary_service(pool.clone(), settings, None).await;
    let c = daily::user_context(&svc, scope, user, Utc::now()).await?;
    println!("{}", serde_json::to_string_pretty(&c)?);
    Ok(())
}

async fn export(pool: PgPool, session: &str, file: &std::path::Path) -> Result<()> {
    if !ContextManager::new(pool).export(session, file).await? {
        return Err(SummaryCliError::NotFound(format!(
            "no context for session {session}"
        )));
    }
    println!("wrote {}", file.display());
    Ok(())
}

/// A blank user would match nothing and print an empty report that looks like an answer.
fn check_user(user: &str) -> Result<()> {
    if user.trim().is_empty() {
        return Err(SummaryCliError::Invalid("--user must not be blank".into()));
    }
    Ok(())
}

async fn work(pool: &PgPool, settings: &Settings) -> Result<()> {
    let svc = crate::system::summary_service(pool.clone(), settings, None).await;
    for o in jobs::drain_at(&svc, Utc::now()).await? {
        println!("{}", serde_json::to_string(&o)?);
    }
    Ok(())
}

/// The text `kvmem summary show` prints: this user's rows only, per character.
pub async fn show(pool: &PgPool, user: &str, character: Option<i64>) -> Result<String> {
    check_user(user)?;
    let mut out = String::new();
    let rows = report::character_summaries(pool, user, character)
        .await
        .map_err(sql)?;
    if rows.is_empty() {
        let _ = writeln!(out, "no session state for user {user}");
    }
    for r in &rows {
        show_character(&mut out, r);
    }
    match report::spine_current(pool, user).await.map_err(sql)? {
        Some((version, content)) => {
            let _ = writeln!(out, "spine v{version}:\n{content}");
        }
        None => {
            let _ = writeln!(out, "spine: none yet");
        }
    }
    Ok(out)
}

fn show_character(out: &mut String, r: &CharacterSummaries) {
    let _ = writeln!(out, "character {}:", r.character_id);
    let _ = writeln!(out, "  state: {}", r.state);
    let _ = writeln!(
        out,
        "  rolling summary ({} versions): {}",
        r.rolling_versions, r.rolling_summary
    );
    if let Some(s) = &r.open_session {
        let _ = writeln!(out, "  open session: {s}");
    }
    for s in r
        .sessions
        .as_ref()
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let _ = writeln!(out, "  session summary: {s}");
    }
}

/// The summary lane's lines for `kvmem status`.
pub async fn status_report(pool: &PgPool) -> Result<String, sqlx::Error> {
    // The summary layer's reads fail only with the database's error, which `kvmem status`
    // reports as it is.
    let db = |e: SummaryError| match e {
        SummaryError::Db(e) => e,
        other => sqlx::Error::Protocol(other.to_string()),
    };
    let mut out = String::from("summary lane:\n");
    let rows = report::lane_counts(pool).await.map_err(db)?;
    if rows.is_empty() {
        out.push_str("  (no summary jobs)\n");
    }
    for r in &rows {
        let _ = writeln!(out, "  {:<8} {:<8} {}", r.kind, r.state, r.jobs);
    }
    let failures = report::recent_failures(pool, 5).await.map_err(db)?;
    for r in &failures {
        let _ = writeln!(
            out,
            "  {} {}: {}",
            r.created_at.format("%Y-%m-%d %H:%M:%S"),
            r.kind,
            r.detail
        );
    }
    Ok(out)
}
