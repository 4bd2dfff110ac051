//! `kvmem demo`: seed 000's 10-turn runbook scene (or `--scene memory`, issue 14's
//! summaries), end to end on a real model and a real Postgres, so a newcomer sees the
//! warm/cold and digest pattern in one command.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::context::digest;
use crate::queue;
use crate::runner;
use crate::system::{Model, Role};
use crate::turn::short_sha;

use super::scene::{demo_character, wait_done};
pub use super::scene::{DemoError, Result};

/// Runs one of the ops/ scripts the demo leans on and returns its stdout.
fn script(name: &'static str, cmd: &mut Command) -> Result<String> {
    let out = cmd.output().map_err(|source| DemoError::Script {
        script: name,
        source,
    })?;
    if !out.status.success() {
        return Err(DemoError::ScriptFailed {
            script: name,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The scene: ten user turns; a conflict starts before turn 4.
const SCENE: [&str; 10] = [
    "We just landed at the outpost. What do you see?",
    "Any sign of the merchant convoy?",
    "Check our supplies, please.",
    "The Merchant Guild declared war on us. What now?",
    "Should we ask the Tech Syndicate for help?",
    "How much do we still owe the First Bank?",
    "Plan the route through the canyon.",
    "A scout reports guild ships nearby. Orders?",
    "Are you ready for a fight?",
    "Summarise our situation in one sentence.",
];

/// Where the repository's `ops/` scripts are (the demo uses them for Postgres and the model).
fn ops_dir() -> PathBuf {
    let here = Path::new("ops");
    if here.join("pg").exists() {
        return here.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ops")
}

/// A throwaway cluster the demo started, stopped on drop.
struct DemoPg {
    dir: String,
}

impl DemoPg {
    fn start() -> Result<(DemoPg, String)> {
        let dir = format!("/tmp/kvmem-demo-pg-{}", std::process::id());
        let text = script(
            "ops/pg start",
            Command::new(ops_dir().join("pg"))
                .arg("start")
                .env_remove("DATABASE_URL")
                .env("KVMEM_PG_DIR", &dir)
                .env("KVMEM_PG_PORT", "54339"),
        )?;
        let url = text
            .trim()
            .strip_prefix("export DATABASE_URL='")
            .and_then(|s| s.strip_suffix('\''))
            .ok_or(DemoError::NoUrl)?
            .to_string();
        Ok((DemoPg { dir }, url))
    }
}

impl Drop for DemoPg {
    fn drop(&mut self) {
        let _ = Command::new(ops_dir().join("pg"))
            .arg("stop")
            .env("KVMEM_PG_DIR", &self.dir)
            .env("KVMEM_PG_PORT", "54339")
            .output();
    }
}

fn model_path(settings: &Settings) -> Result<PathBuf> {
    if let Some(p) = &settings.engine.model_path {
        return Ok(p.clone());
    }
    eprintln!("demo: fetching SmolLM2-135M-Instruct (ops/fetch-model)");
    let text = script(
        "ops/fetch-model",
        &mut Command::new(ops_dir().join("fetch-model")),
    )?;
    Ok(PathBuf::from(text.lines().last().unwrap_or("").trim()))
}

/// Which scene `kvmem demo` plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scene {
    /// The 10-turn runbook: warm and cold starts, the digest, a summary table.
    Runbook,
    /// Issue 14's summaries: a session closes, its summary is made, a new session opens
    /// with it available.
    Memory,
    /// Issue 15's recall: facts told in session 1 reach a cold session 2 through recall
    /// and the context block.
    Recall,
}

/// Runs the scene. Leaves nothing running: the worker stops, a cluster it started is removed.
/// On the database of a DATABASE_URL that already holds turns it refuses, unless `force`,
/// before it changes anything there.
pub async fn run(settings: Settings, scene: Scene, force: bool) -> Result<()> {
    let (_pg, url) = match settings.db.url.clone().filter(|u| !u.is_empty()) {
        Some(url) => {
            if !force {
                refuse_held_turns(&settings).await?;
            }
            (None, url)
        }
        None => {
            eprintln!("demo: DATABASE_URL unset; starting a throwaway Postgres");
            let (pg, url) = DemoPg::start()?;
            (Some(pg), url)
        }
    };
    let kv_dir = tempfile_dir()?;
    let settings = settings
        .with(serde_json::json!({ "snapshot": { "dir": kv_dir }, "db": { "url": url } }))?;
    let model = model_path(&settings)?;
    let mut overrides = serde_json::json!({ "engine": { "model_path": model } });
    if scene == Scene::Memory {
        // The summary lane alone: extraction and embedding would share the two cores.
        overrides["memory"] = serde_json::json!({ "lane": false });
        overrides["summary"] = serde_json::json!({ "lane": true });
    }
    if scene == Scene::Recall {
        // The scene runs both lanes itself, on a simulated clock.
        overrides["memory"] = serde_json::json!({ "lane": false });
        overrides["summary"] = serde_json::json!({ "lane": false });
    }
    let settings = Arc::new(settings.with(overrides)?);
    let app = crate::system::build(settings.clone(), Role::Writer { connections: 8 }).await?;
    let pool = app.pool.clone();
    let engine = crate::system::load_model(&settings).await?;
    eprintln!(
        "demo: model {} (sha256 {})",
        engine.model_path.display(),
        short_sha(&engine.model_sha)
    );
    let deps = app.deps(Model::Llama(engine.clone()), runner::new_worker_id())?;
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(runner::run(deps, shutdown.clone()));
    let result = match scene {
        Scene::Runbook => runbook(&pool).await,
        Scene::Memory => super::demo_memory::scene(&pool).await,
        Scene::Recall => super::demo_recall::scene(&pool, &settings, engine).await,
    };
    shutdown.cancel();
    let _ = handle.await;
    let _ = std::fs::remove_dir_all(&kv_dir);
    println!("\n{}", result?);
    pool.close().await;
    Ok(())
}

/// Fails when the configured database holds turns: a real queue, whose queued turns the
/// demo's worker would answer. A database without kvmem's tables holds none.
async fn refuse_held_turns(settings: &Settings) -> Result<()> {
    let as_is = Role::AsIs { connections: 1 };
    let pool = crate::system::build(Arc::new(settings.clone()), as_is)
        .await?
        .pool;
    let turns = queue::turns_held(&pool).await?;
    pool.close().await;
    match turns {
        0 => Ok(()),
        n => Err(DemoError::HoldsTurns(n)),
    }
}

async fn runbook(pool: &PgPool) -> Result<String> {
    let sid = scene(pool).await?;
    summary(pool, &sid).await
}

fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("kvmem-demo-kv-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

async fn scene(pool: &PgPool) -> Result<String> {
    let sid = format!("demo_{}", chrono::Utc::now().format("%Y%m%d%H%M%S"));
    let user = "demo_user";
    let ch = demo_character(pool, user).await?;
    for (t, key, value) in [
        ("alliance", "tech_syndicate", "Tech Syndicate partnership"),
        ("debt", "first_bank", "Owes 500 credits to First Bank"),
    ] {
        digest::seed_fact(pool, &sid, t, key, value).await?;
    }
    for (i, msg) in SCENE.iter().enumerate() {
        if i == 3 {
            // Seed 000's "Start Conflict" SQL.
            digest::start_demo_conflict(pool, &sid).await?;
            eprintln!("demo: state change before T4: conflict 'merchant_war' started");
        }
        let id = queue::enqueue(pool, &sid, user, ch, msg, None).await?;
        let reply = wait_done(pool, id).await?;
        eprintln!("T{} user: {msg}\nT{} reply: {}", i + 1, i + 1, reply.trim());
    }
    Ok(sid)
}

/// The readable table: one row per turn.
pub async fn summary(pool: &PgPool, sid: &str) -> Result<String> {
    let rows = queue::ok_turn_logs(pool, sid).await?;
    let mut out = String::new();
    let _ = writeln!(out, "| turn | start | digest_injected | digest_version | tokens_in_kv | kv_bytes | ttft_ms | latency_ms |");
    let _ = writeln!(out, "|---:|---|---|---|---:|---:|---:|---:|");
    for (i, r) in rows.iter().enumerate() {
        let _ = writeln!(
            out,
            "| T{} | {} | {} | {} | {} | {} | {} | {} |",
            i + 1,
            if r.cold { "cold" } else { "warm" },
            r.digest_injected,
            short_sha(&r.digest_version),
            r.tokens_in_kv,
            r.kv_bytes,
            r.ttft_ms,
            r.latency_ms
        );
    }
    Ok(out)
}
