//! `kvmem replay` as the shell runs it: the scenes named on the command line, a worker on
//! the replay lane in this process unless told otherwise, and the report written out.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::error::CommandError;
use super::replay;
use super::worker::{in_process, GeneratorKind};
use crate::config::Settings;
use crate::system::{self, Role};

#[derive(Debug, Args)]
pub struct ReplayArgs {
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

pub async fn run(args: ReplayArgs, settings: Settings) -> Result<(), CommandError> {
    let mut replay_settings = settings;
    replay_settings.queue.lanes = vec!["replay".into()];
    let settings = Arc::new(replay_settings);
    let writer = Role::Writer {
        connections: settings.queue.concurrency + 4,
    };
    let app = system::build(settings, writer).await?;
    let pool = app.pool.clone();
    let mut all = replay::scenes_from_db(&pool, &args.session).await?;
    if let Some(path) = &args.scenes {
        all.extend(replay::scenes_from_jsonl(path)?);
    }
    if all.is_empty() {
        return Err(CommandError::Failed(
            "nothing to replay: give --session or --scenes".into(),
        ));
    }
    let shutdown = CancellationToken::new();
    let worker = in_process(args.no_worker, &app, args.generator, &shutdown)
        .await?
        .worker;
    let run_id = chrono::Utc::now().format("%Y%m%dT%H%M%S%3f").to_string();
    let timeout = Duration::from_secs(args.timeout_s);
    let result = replay::run(&pool, &all, &run_id, timeout, true).await;
    shutdown.cancel();
    if let Some(w) = worker {
        let _ = w.await;
    }
    let result = result?;
    let report = serde_json::to_string_pretty(&result)?;
    let writing = format!("writing {}", args.report.display());
    std::fs::write(&args.report, report).map_err(CommandError::io(writing))?;
    print!("{}", replay::summary(&result));
    println!("report: {}", args.report.display());
    if args.check && (result.divergences > 0 || result.failures > 0) {
        return Err(CommandError::Failed(format!(
            "replay check failed: {} diverged, {} failed",
            result.divergences, result.failures
        )));
    }
    Ok(())
}
