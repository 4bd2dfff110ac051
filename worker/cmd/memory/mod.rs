//! `kvmem memory …`: import, search and inspect long-term memory from a shell, straight
//! against Postgres (schema created by the subcommands that write), with no worker running.

mod error;
mod eval;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde_json::json;
use sqlx::PgPool;

use crate::config::Settings;
use crate::db;
use crate::memory::ingest::import::{self, ExtractMode};
use crate::memory::ingest::jobs;
use crate::memory::notes::todos;
use crate::memory::search::cards;
use crate::memory::search::{self, SearchRequest};
use crate::memory::store::{self, Scope};
use crate::memory::{self, render, MemoryError, MemoryService, RankerKind};
pub use error::{MemoryCliError, Result};

#[derive(Debug, Args)]
pub struct MemoryArgs {
    #[command(subcommand)]
    pub command: MemoryCommand,
}

/// Who: the user is a wall; the character filters reads; the guild is a wall.
#[derive(Debug, Clone, Args)]
pub struct ScopeArgs {
    #[arg(long)]
    pub user: String,
    #[arg(long)]
    pub character: Option<i64>,
    #[arg(long)]
    pub guild: Option<String>,
    /// A ranking hint only: memories from this channel score slightly higher.
    #[arg(long)]
    pub channel: Option<String>,
}

impl ScopeArgs {
    fn scope(&self) -> Scope {
        Scope {
            user_id: self.user.clone(),
            character_id: self.character,
            guild_id: self.guild.clone(),
            channel_id: self.channel.clone(),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Import chat history: one JSON object a line with user_id, optional character_id,
    /// session_id, message_id, speaker, text, at (RFC 3339). Idempotent by message_id.
    /// Writes: migrates first.
    Import {
        #[arg(long)]
        file: PathBuf,
        #[arg(long, value_enum, default_value = "none")]
        extract: ExtractMode,
        /// Abort without importing anything if any line is bad.
        #[arg(long)]
        strict: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Ranked memories and messages for a query. Read-only: a row the memory lane has not
    /// embedded yet is found by its lexical legs alone; never migrates.
    Search {
        #[command(flatten)]
        scope: ScopeArgs,
        #[arg(long)]
        query: String,
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Search what was known and valid at this time (RFC 3339).
        #[arg(long)]
        as_of: Option<String>,
        /// hybrid | weighted | recency-importance | lexical | vector (default: memory.ranker).
        #[arg(long)]
        ranker: Option<String>,
        /// Strict mode: only hits that pass the relevance gate.
        #[arg(long)]
        strict: bool,
        #[arg(long)]
        json: bool,
    },
    /// The current facts ("what do you know"), with foundation memories and cards.
    /// Read-only; never migrates.
    Show {
        #[command(flatten)]
        scope: ScopeArgs,
        #[arg(long)]
        as_of: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Store an explicit, pinned fact (queued through kvmem_remember, then run here).
    /// Writes: migrates first.
    Remember {
        #[command(flatten)]
        scope: ScopeArgs,
        #[arg(long)]
        text: String,
        /// `<type>:<name>`, repeatable.
        #[arg(long)]
        entity: Vec<String>,
    },
    /// Archive the facts matching a text (queued through kvmem_forget, then run here).
    /// Writes: migrates first.
    Forget {
        #[command(flatten)]
        scope: ScopeArgs,
        #[arg(long)]
        text: String,
    },
    /// The todos of a user with one character (persona-scoped): open ones, or all.
    /// Read-only; never migrates.
    Todos {
        #[arg(long)]
        user: String,
        #[arg(long)]
        character: i64,
        /// Done and dropped ones too, with what closed them.
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Entity cards: what is known about each person, place or thing. Read-only; never
    /// migrates.
    Cards {
        #[command(flatten)]
        scope: ScopeArgs,
        #[arg(long)]
        json: bool,
    },
    /// The daily journal YYYY-MM-DD.md, rendered from Postgres. Read-only; never migrates.
    Journal {
        #[command(flatten)]
        scope: ScopeArgs,
        #[arg(long)]
        date: String,
    },
    /// MEMORY.md, rendered from Postgres. Read-only; never migrates.
    Snapshot {
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Give every message, span and fact a vector of the configured embedder: the first
    /// fill, or after a switch of model (searches leave the old model's vectors out until
    /// then). Shows a progress bar; a run that stops resumes where it was. Writes:
    /// migrates first.
    Reindex {
        #[arg(long)]
        user: Option<String>,
    },
    /// Propose (and with --merge, record) merges of near-identical entity slugs.
    /// Read-only unless --merge, which writes (and migrates first).
    Entities {
        #[arg(long)]
        user: String,
        #[arg(long, default_value_t = 0.4)]
        threshold: f32,
        #[arg(long)]
        merge: bool,
    },
    /// Curator pass: keep-80/120 archiving and near-duplicate folding for one user.
    /// Writes: migrates first.
    Curate {
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Run queued memory jobs until none is left. Writes: migrates first.
    Work,
    /// Evidence recall@5/@10 per ranker on a question file (ops/bench-memory): one JSON
    /// object a line with user_id, question, evidence (message ids), optional type, as_of.
    /// Read-only on the database (as `search`); never migrates.
    Eval {
        #[arg(long)]
        questions: PathBuf,
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "lexical,vector,recency-importance,weighted,hybrid"
        )]
        rankers: Vec<String>,
        /// Use each question's as_of (the end of its conversation) as --as-of.
        #[arg(long)]
        as_of: bool,
        /// Also write every question's candidates, unranked, with the signals a ranker
        /// reads (JSON lines), for fitting a ranker outside kvmem.
        #[arg(long)]
        dump: Option<PathBuf>,
    },
}

fn parse_time(s: &Option<String>) -> Result<Option<DateTime<Utc>>> {
    s.as_deref()
        .map(|t| {
            DateTime::parse_from_rfc3339(t)
                .map(|d| d.with_timezone(&Utc))
                .map_err(|e| {
                    MemoryError::Invalid(format!("--as-of {t:?} is not RFC 3339: {e}")).into()
                })
        })
        .transpose()
}

fn print_json(v: &impl serde::Serialize) -> Result<()> {
    let s = serde_json::to_string_pretty(v).map_err(|e| MemoryCliError::Output(e.to_string()))?;
    println!("{s}");
    Ok(())
}

impl MemoryCommand {
    /// The subcommand as `kvmem memory <name>`, and whether it writes (so migrates first);
    /// one that only reads must find the schema current instead.
    fn name_and_writes(&self) -> (&'static str, bool) {
        match self {
            MemoryCommand::Import { .. } => ("memory import", true),
            MemoryCommand::Search { .. } => ("memory search", false),
            MemoryCommand::Show { .. } => ("memory show", false),
            MemoryCommand::Remember { .. } => ("memory remember", true),
            MemoryCommand::Forget { .. } => ("memory forget", true),
            MemoryCommand::Todos { .. } => ("memory todos", false),
            MemoryCommand::Cards { .. } => ("memory cards", false),
            MemoryCommand::Journal { .. } => ("memory journal", false),
            MemoryCommand::Snapshot { .. } => ("memory snapshot", false),
            MemoryCommand::Reindex { .. } => ("memory reindex", true),
            MemoryCommand::Entities { merge, .. } => ("memory entities", *merge),
            MemoryCommand::Curate { .. } => ("memory curate", true),
            MemoryCommand::Work => ("memory work", true),
            MemoryCommand::Eval { .. } => ("memory eval", false),
        }
    }
}

/// Runs one `kvmem memory` command against `DATABASE_URL`: one that writes migrates first,
/// one that only reads refuses a schema behind this binary.
pub async fn run(args: MemoryArgs, settings: Settings) -> Result<()> {
    let as_is = crate::system::Role::AsIs { connections: 4 };
    let pool = crate::system::build(Arc::new(settings.clone()), as_is)
        .await?
        .pool;
    match args.command.name_and_writes() {
        (_, true) => {
            db::migrate(&pool).await?;
        }
        (name, false) => {
            db::require_current(&pool, name).await?;
        }
    }
    let needs_embedder = !matches!(
        args.command,
        MemoryCommand::Cards { .. }
            | MemoryCommand::Journal { .. }
            | MemoryCommand::Snapshot { .. }
            | MemoryCommand::Entities { .. }
            | MemoryCommand::Show { .. }
            | MemoryCommand::Todos { .. }
            | MemoryCommand::Work
    );
    let svc = crate::system::memory_service(pool.clone(), &settings, needs_embedder).await?;
    match args.command {
        MemoryCommand::Import {
            file,
            extract,
            strict,
            json,
        } => import_file(&svc, &file, extract, strict, json).await?,
        MemoryCommand::Search {
            scope,
            query,
            limit,
            as_of,
            ranker,
            strict,
            json,
        } => {
            let ranker = match ranker {
                Some(r) => RankerKind::parse(&r)?,
                None => svc.config.ranker,
            };
            let req = SearchRequest {
                scope: scope.scope(),
                query,
                limit,
                as_of: parse_time(&as_of)?,
                ranker,
                strict,
                skip_speaker: None,
            };
            let res = search::search(&svc, &req).await?;
            print_hits(&res, json)?;
        }
        MemoryCommand::Show { scope, as_of, json } => {
            show(&pool, &scope.scope(), parse_time(&as_of)?, json).await?
        }
        MemoryCommand::Remember {
            scope,
            text,
            entity,
        } => {
            let job = memory::queue_remember(&pool, &scope.scope(), &text, &entity).await?;
            print_job(&svc, job).await?;
        }
        MemoryCommand::Forget { scope, text } => {
            let job = memory::queue_forget(&pool, &scope.scope(), &text).await?;
            print_job(&svc, job).await?;
        }
        MemoryCommand::Todos {
            user,
            character,
            all,
            json,
        } => {
            Scope::user(&user).validate()?;
            let list = todos::list(&pool, &user, character, !all).await?;
            if json {
                print_json(&list)?;
            } else if list.is_empty() {
                println!(
                    "no {}todos for user {user} with character {character}",
                    if all { "" } else { "open " }
                );
            } else {
                for t in list {
                    let due = t
                        .due_date
                        .map(|d| format!(" (due {d})"))
                        .unwrap_or_default();
                    let closed = match (&t.closed_by_message_id, &t.closed_evidence) {
                        (Some(m), Some(e)) => format!(" — closed by {m}: \"{e}\""),
                        _ => String::new(),
                    };
                    println!(
                        "#{} [{} {}] {}{due}{closed}",
                        t.id, t.status, t.kind, t.text
                    );
                }
            }
        }
        MemoryCommand::Cards { scope, json } => {
            let cs = cards::cards_for_refs(&pool, &scope.scope(), None).await?;
            if json {
                print_json(&cs)?;
            } else {
                for c in cs {
                    println!("{}", c.text);
                }
            }
        }
        MemoryCommand::Journal { scope, date } => {
            print!("{}", render::journal(&pool, &scope.scope(), &date).await?);
        }
        MemoryCommand::Snapshot { scope } => {
            print!("{}", render::snapshot(&pool, &scope.scope()).await?);
        }
        MemoryCommand::Reindex { user } => {
            let n = import::reindex(&svc, user.as_deref(), true).await?;
            println!("reindexed {n} vector(s)");
        }
        MemoryCommand::Entities {
            user,
            threshold,
            merge,
        } => entities(&pool, &user, threshold, merge).await?,
        MemoryCommand::Curate { scope } => curate(&svc, &scope.scope()).await?,
        MemoryCommand::Eval {
            questions,
            rankers,
            as_of,
            dump,
        } => {
            let rankers: Vec<RankerKind> = rankers
                .iter()
                .map(|r| RankerKind::parse(r))
                .collect::<std::result::Result<_, _>>()?;
            eval::eval(&svc, &questions, &rankers, as_of).await?;
            if let Some(out) = dump {
                eval::dump(&svc, &questions, as_of, &out).await?;
            }
        }
        MemoryCommand::Work => work(pool, &settings).await?,
    }
    Ok(())
}

/// `kvmem memory work`: the lane exactly as a worker runs it (the extraction model loaded
/// when `memory.extract` is on). Jobs that ask for extraction and find no model here stay
/// queued, and the count says so.
async fn work(pool: PgPool, settings: &Settings) -> Result<()> {
    let svc = crate::system::memory_lane_service(pool, settings, None, None).await?;
    let done = jobs::drain(&svc).await?;
    println!("ran {} memory job(s)", done.len());
    let waiting = memory::extraction_waiting(&svc.pool).await?;
    if waiting > 0 && svc.extractor.is_none() {
        eprintln!(
            "note: {waiting} job(s) ask for fact extraction and stay queued: this process has no \
             extraction model (set KVMEM_MEMORY_EXTRACT=true, and KVMEM_MEMORY_EXTRACT_MODEL_PATH \
             or KVMEM_MODEL_PATH), or a worker with one runs them"
        );
    }
    Ok(())
}

/// `kvmem memory import`: the report, the rejected lines on stderr, and an error when every
/// line was rejected.
async fn import_file(
    svc: &MemoryService,
    file: &Path,
    extract: ExtractMode,
    strict: bool,
    json: bool,
) -> Result<()> {
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let report = import::import_file(svc, file, extract, strict, progress || !json).await?;
    for r in &report.rejections {
        eprintln!("rejected {r}");
    }
    if json {
        print_json(&report)?;
    } else {
        println!(
            "imported {} | skipped-duplicate {} | rejected {} | embedded {} | backfilled {} | queued for extraction {} | {:.1} msgs/s{}",
            report.imported,
            report.skipped_duplicate,
            report.rejected,
            report.embedded,
            report.backfilled,
            report.queued_for_extraction,
            report.messages_per_second,
            if report.semantic { "" } else { " | LEXICAL ONLY (no embedder)" }
        );
    }
    if extract == ExtractMode::Llm && svc.extractor.is_none() {
        eprintln!(
            "note: {} message(s) queued on the memory lane; a worker with an extraction model runs them",
            report.queued_for_extraction
        );
    }
    if report.lines > 0 && report.rejected == report.lines {
        return Err(MemoryError::Invalid("every line was rejected".into()).into());
    }
    Ok(())
}

/// `kvmem memory search`'s output: the JSON the benchmark harness reads, or a numbered list.
fn print_hits(res: &search::SearchResponse, json: bool) -> Result<()> {
    if json {
        return print_json(res);
    }
    for (i, h) in res.hits.iter().enumerate() {
        println!(
            "{:>2}. [{:?} {}] {:.4} {}{}",
            i + 1,
            h.kind,
            h.id,
            h.score,
            h.speaker
                .as_deref()
                .map(|s| format!("{s}: "))
                .unwrap_or_default(),
            h.text
        );
    }
    Ok(())
}

/// `kvmem memory show`: a scope's facts, its foundation and its entity cards.
async fn show(pool: &PgPool, s: &Scope, as_of: Option<DateTime<Utc>>, json: bool) -> Result<()> {
    let facts = store::facts(pool, s, as_of, 1000).await?;
    let found = cards::foundation(pool, s).await?;
    let cs = cards::cards_for_refs(pool, s, None).await?;
    if json {
        return print_json(&json!({"facts": facts, "foundation": found, "cards": cs}));
    }
    for f in &facts {
        let pin = if f.pinned { " [pinned]" } else { "" };
        println!(
            "{} {} {}{pin} (imp {}, {})",
            f.id, f.kind, f.text, f.importance, f.source
        );
    }
    for c in &cs {
        println!("{}", c.text);
    }
    Ok(())
}

/// `kvmem memory entities`: near-identical entity names, merged with `--merge`.
async fn entities(pool: &PgPool, user: &str, threshold: f32, merge: bool) -> Result<()> {
    let props = store::propose_merges(pool, user, threshold).await?;
    for p in &props {
        println!(
            "{} <- {} (similarity {:.2})",
            p.canonical, p.alias, p.similarity
        );
        if merge {
            store::merge_entities(pool, user, &p.alias, &p.canonical, Some(p.similarity)).await?;
        }
    }
    if props.is_empty() {
        println!("no near-identical entities");
    }
    Ok(())
}

/// `kvmem memory curate`: the keep limits, then near-duplicate folding, for one user.
async fn curate(svc: &MemoryService, s: &Scope) -> Result<()> {
    s.validate()?;
    let archived = store::archive_keep(
        &svc.pool,
        &s.user_id,
        svc.config.keep_user,
        svc.config.keep_lore,
    )
    .await?;
    let folded = jobs::curate(svc, s).await?;
    println!(
        "archived {archived} over the keep limits; folded {} near-duplicate(s)",
        folded.len()
    );
    Ok(())
}

async fn print_job(svc: &MemoryService, job: i64) -> Result<()> {
    for o in jobs::drain(svc).await? {
        match o {
            jobs::Outcome::Done { job_id, result, .. } if job_id == job => {
                return print_json(&json!({"job_id": job, "state": "done", "result": result}));
            }
            jobs::Outcome::Failed { job_id, error, .. } if job_id == job => {
                return Err(MemoryError::Invalid(format!("job {job} failed: {error}")).into());
            }
            _ => {}
        }
    }
    Err(MemoryError::NotFound(format!("job {job} was not run")).into())
}
