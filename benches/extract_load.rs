//! What the memory lane's fact extraction costs live chat under steady load. Extraction
//! runs the LLM on every user message; a new job waits for an idle worker, and one already
//! running pauses between decode steps while a turn generates, but the turn still waits
//! out the step under way and shares the machine's memory bandwidth. This runs the same steady chat twice, one `kvmem worker` process per phase,
//! once with the memory lane off and once with it on and extracting, and reports turn
//! latency side by side, whether the lane kept up with the messages (backlog, drops,
//! extractions per second), and checks that every turn ran exactly once either way.
//! Run through `ops/bench-extract-load` (`--quick` to check it works).
//!
//! With `--closed-loop` each session sends its next line as soon as its reply is done, so
//! the worker is never idle for want of a turn: the chat rate it serves is its saturation
//! rate, and the lane gets only the gaps between turns.
//!
//! `cargo bench --bench extract_load -- [--quick] [--closed-loop] [--sessions N]
//! [--period-s N] [--minutes F] [--order off-on|on-off] [--reply-tokens N]`

mod common;
#[path = "extract_load/lane.rs"]
mod lane;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use chrono::{DateTime, Utc};
use lane::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::time::Instant;

/// The warm-up turn's user: its rows are left out of every count.
const WARMUP: &str = "warmup";
/// How long the lane gets, after the last turn is done, to empty its queue.
const DRAIN: Duration = Duration::from_secs(60);

/// Chat lines written for this benchmark: personal facts the extractor should keep,
/// mixed with small talk and questions it should skip or find nothing in.
const LINES: &[&str] = &[
    "My name is Priya and I work night shifts as a nurse in Leeds.",
    "haha okay, fair enough",
    "I just adopted a grey cat called Biscuit from the shelter.",
    "What would you do if the engines failed out here?",
    "My brother Tomas is getting married in Lisbon next June.",
    "Long day today. Finally home.",
    "I'm allergic to peanuts, so I always check the labels twice.",
    "I've been learning the cello for about two years now.",
    "lol yes",
    "My daughter starts primary school in September and I'm nervous about it.",
    "I drive a delivery van for a bakery, mostly early mornings.",
    "Do you ever get tired of giving orders?",
    "We moved from Glasgow to Toronto last spring for my wife's job.",
    "I prefer tea over coffee, green tea especially.",
    "Thanks, that actually helps a lot.",
    "My favourite book is still The Left Hand of Darkness.",
    "I run a small pottery stall at the Saturday market.",
    "Honestly I'm just tired today, nothing big.",
    "My best friend Kenji is a software tester in Osaka.",
    "I'm training for a half marathon in October.",
    "good morning captain",
    "I can't eat gluten, it makes me really sick.",
    "My mum lives alone in a village outside Cork and I call her every Sunday.",
    "How far is the next station from here?",
    "I studied marine biology but ended up working in a bank.",
    "We have two kids, Ada who is seven and Leo who is four.",
    "ok cool, see you later",
    "I'm saving up to buy a second-hand sailing boat.",
    "My partner Sam is a firefighter and works twelve-hour shifts.",
    "I hate the cold, winters here are brutal for me.",
    "Did you sleep at all last night?",
    "I'm vegetarian, have been since I was fifteen.",
    "My grandfather taught me to play chess when I was six.",
    "Nice, sounds good to me.",
    "I work from home on Fridays, so that's my quiet day.",
    "My dog Pepper is a twelve-year-old border collie and still fast.",
    "I speak Polish at home with my parents and English at work.",
    "Weather's been weird this week, right?",
    "I broke my wrist skiing last winter and it still aches when it rains.",
    "I'm thinking of going back to university to study law.",
];

struct Plan {
    quick: bool,
    /// Sessions send on reply instead of on a clock (`period_s` is then unused).
    closed_loop: bool,
    sessions: usize,
    period_s: f64,
    minutes: f64,
    reply_tokens: u32,
    model: PathBuf,
    embedder: PathBuf,
    base_url: String,
}

impl Plan {
    fn phase_s(&self) -> f64 {
        self.minutes * 60.0
    }
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn parsed<T: std::str::FromStr>(name: &str, quick_v: T, full: T, quick: bool) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match arg(name) {
        Some(v) => v.parse().with_context(|| format!("{name} {v}")),
        None => Ok(if quick { quick_v } else { full }),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let plan = plan_from_args()?;
    let order: Vec<bool> = match arg("--order").as_deref().unwrap_or("off-on") {
        "off-on" => vec![false, true],
        "on-off" => vec![true, false],
        other => anyhow::bail!("--order {other}: off-on or on-off"),
    };
    let model = plan.model.file_name().unwrap_or_default().to_string_lossy();
    if plan.closed_loop {
        println!(
            "## Extraction lane at saturation: {} sessions, each sending its next message when its reply is done, {:.1} min per phase ({model}, replies <= {} tokens)\n",
            plan.sessions, plan.minutes, plan.reply_tokens,
        );
    } else {
        println!(
            "## Extraction lane under steady chat: {} sessions, 1 message each every {} s, {:.1} min per phase ({:.2} msg/s; {model}, replies <= {} tokens)\n",
            plan.sessions,
            plan.period_s,
            plan.minutes,
            plan.sessions as f64 / plan.period_s,
            plan.reply_tokens,
        );
    }
    let mut rows = Vec::new();
    for lane in order {
        rows.push(run(&plan, lane).await?);
    }
    print_table(&rows);
    print_backlogs(&rows);
    let ratio = latency_ratio(&rows);
    write_results(&plan, &rows, ratio)
}

fn plan_from_args() -> Result<Plan> {
    let quick = std::env::args().any(|a| a == "--quick");
    let plan = Plan {
        quick,
        closed_loop: std::env::args().any(|a| a == "--closed-loop"),
        sessions: parsed("--sessions", 2, 10, quick)?,
        period_s: parsed("--period-s", 3.0, 10.0, quick)?,
        minutes: parsed("--minutes", 40.0 / 60.0, 10.0, quick)?,
        // Short replies, as in the other turn-latency benches: at 1 message a second a
        // 135M model on two cores has no room for long ones, lane or not.
        reply_tokens: parsed("--reply-tokens", 32, 32, quick)?,
        model: PathBuf::from(
            std::env::var("KVMEM_EXTRACT_LOAD_MODEL")
                .context("KVMEM_EXTRACT_LOAD_MODEL is not set (ops/bench-extract-load sets it)")?,
        ),
        embedder: PathBuf::from(
            std::env::var("KVMEM_EXTRACT_LOAD_EMBEDDER").context(
                "KVMEM_EXTRACT_LOAD_EMBEDDER is not set (ops/bench-extract-load sets it)",
            )?,
        ),
        base_url: std::env::var("DATABASE_URL").context("DATABASE_URL is not set")?,
    };
    ensure!(
        plan.sessions > 0 && plan.period_s > 0.0 && plan.minutes > 0.0,
        "--sessions, --period-s and --minutes must be above 0"
    );
    Ok(plan)
}

fn print_table(rows: &[Value]) {
    println!("| lane | turns enq / done | turns/s | turn p50 ms | turn p95 ms | turn max ms | mem jobs enq | done | queued at end | dropped | msgs extracted (in chat window) | extract msg/s (user msg/s in) | kept up |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let on = r["lane"] == "on";
        println!(
            "| {} | {} / {} | {:.3} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} | {} ({}) | {:.3} ({:.3}) | {} |",
            r["lane"].as_str().unwrap_or(""),
            r["turns_enqueued"],
            r["turns_done"],
            r["turns_per_s"].as_f64().unwrap_or(0.0),
            r["turn_ms"]["p50"].as_f64().unwrap_or(0.0),
            r["turn_ms"]["p95"].as_f64().unwrap_or(0.0),
            r["turn_ms"]["max"].as_f64().unwrap_or(0.0),
            r["memory"]["enqueued"],
            r["memory"]["done"],
            r["memory"]["queued_at_end"],
            r["memory"]["dropped"],
            r["memory"]["extracted"],
            r["memory"]["extracted_during_chat"],
            r["memory"]["extract_per_s"].as_f64().unwrap_or(0.0),
            r["user_msgs_per_s"].as_f64().unwrap_or(0.0),
            match (on, r["memory"]["kept_up"].as_bool()) {
                (false, _) => "n/a (lane off)".to_string(),
                (true, Some(true)) => "yes".to_string(),
                _ => format!(
                    "no ({} left after {} s drain)",
                    r["memory"]["queued_at_end"],
                    DRAIN.as_secs()
                ),
            },
        );
    }
}

/// The lane's backlog over each phase, every 30 s: a queue that only grows has not kept up.
fn print_backlogs(rows: &[Value]) {
    for r in rows {
        let points: Vec<String> = r["backlog_every_30s"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| format!("{}s:{}/{}", p[0], p[1], p[2]))
            .collect();
        println!(
            "\nlane {}: turns waiting / memory jobs queued, every 30 s: {}",
            r["lane"].as_str().unwrap_or(""),
            points.join(" ")
        );
    }
}

/// Turn latency with the lane on over off, p50 and p95, when both phases ran.
fn latency_ratio(rows: &[Value]) -> Value {
    let by = |lane: &str| rows.iter().find(|r| r["lane"] == lane);
    match (by("on"), by("off")) {
        (Some(on), Some(off)) => {
            let r = |p: &str| {
                on["turn_ms"][p].as_f64().unwrap_or(0.0)
                    / off["turn_ms"][p].as_f64().unwrap_or(0.0).max(1.0)
            };
            println!(
                "\nturn latency, lane on / lane off: p50 {:.2}x, p95 {:.2}x",
                r("p50"),
                r("p95")
            );
            json!({"p50": r("p50"), "p95": r("p95")})
        }
        _ => Value::Null,
    }
}

fn write_results(plan: &Plan, rows: &[Value], ratio: Value) -> Result<()> {
    let quick = plan.quick;
    let out = PathBuf::from("ops/bench-results");
    std::fs::create_dir_all(&out)?;
    // The quick check must not overwrite a long run's results.
    let file = out.join(if quick {
        "extract_load-quick.json"
    } else {
        "extract_load.json"
    });
    std::fs::write(
        &file,
        serde_json::to_string_pretty(&json!({
            "suite": "extract_load",
            "plan": {
                "quick": plan.quick, "sessions": plan.sessions, "period_s": plan.period_s,
                "minutes": plan.minutes, "closed_loop": plan.closed_loop, "reply_tokens": plan.reply_tokens,
                "model": plan.model, "embedder": plan.embedder,
            },
            "phases": rows,
            "ratio_on_off": ratio,
        }))?,
    )?;
    println!("\n_results in {}_", file.display());
    Ok(())
}

/// Kills the worker process however the phase ends.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Worker {
    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.0.try_wait()? {
            anyhow::bail!("the worker exited early: {status}");
        }
        Ok(())
    }
}

fn user(s: usize) -> String {
    format!("load{s}")
}

/// One message per session every `period_s`, session `s` starting `s * period_s /
/// sessions` in, so arrivals are evenly spaced: (seconds from the start, session, index).
fn schedule(plan: &Plan) -> Vec<(f64, usize, usize)> {
    let mut events = Vec::new();
    for s in 0..plan.sessions {
        let offset = s as f64 * plan.period_s / plan.sessions as f64;
        let mut k = 0;
        while offset + k as f64 * plan.period_s < plan.phase_s() {
            events.push((offset + k as f64 * plan.period_s, s, k));
            k += 1;
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    events
}

async fn db_now(pool: &PgPool) -> Result<DateTime<Utc>> {
    Ok(sqlx::query_scalar("SELECT now()").fetch_one(pool).await?)
}

async fn run(plan: &Plan, lane: bool) -> Result<Value> {
    let tag = if lane { "on" } else { "off" };
    println!("phase: memory lane {tag} ...");
    let (pool, url) =
        common::fresh_db(&plan.base_url, &format!("kvmem_extract_load_{tag}"), 8).await?;
    // One user per session, as in a real service: the lane orders jobs per user and
    // caps each user's backlog.
    let mut chars = Vec::new();
    for s in 0..plan.sessions {
        chars.push(common::character(&pool, &user(s)).await?);
    }
    let warm_ch = common::character(&pool, WARMUP).await?;
    let kv = tempfile::tempdir()?;
    let mut worker = spawn_worker(plan, &url, kv.path(), lane)?;
    warm_up(&pool, &mut worker, warm_ch, lane).await?;

    let t0 = db_now(&pool).await?;
    let start = Instant::now();
    let (stop, sampler) = sample_backlogs(pool.clone());
    let (ids, late_ms) = if plan.closed_loop {
        (closed_loop(plan, &pool, &mut worker, &chars).await?, 0.0)
    } else {
        open_loop(plan, &pool, &mut worker, &chars).await?
    };
    let schedule_s = start.elapsed().as_secs_f64();
    let total = ids.len() as i64;
    wait_turns(&pool, &mut worker, total).await?;
    let chat_end = db_now(&pool).await?;
    let chat_s = start.elapsed().as_secs_f64();
    let drain_s = if lane {
        drain(&pool, &mut worker).await?
    } else {
        0.0
    };
    stop.store(true, Ordering::Relaxed);
    let backlog = sampler.await?;
    drop(worker);

    check_invariants(&pool, &ids).await?;
    let turn_ms: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM finished_at - created_at)::float8 * 1000
           FROM turns WHERE user_id <> $1 AND state = 'done'",
    )
    .bind(WARMUP)
    .fetch_all(&pool)
    .await?;
    let memory = lane_figures(&pool, chat_end).await?;
    // The rate while chat runs (first enqueue to last turn done): the drain after it has
    // the machine to itself and would flatter the lane.
    let chat_window_s = (chat_end - t0).num_milliseconds() as f64 / 1000.0;
    pool.close().await;
    Ok(json!({
        "lane": tag,
        "turns_enqueued": total, "turns_done": turn_ms.len(),
        "turn_ms": common::pcts(turn_ms),
        "user_msgs_per_s": total as f64 / plan.phase_s(),
        // What the worker served while chat ran: in a closed loop, its saturation rate.
        "turns_per_s": total as f64 / chat_window_s.max(1e-3),
        "schedule_s": schedule_s, "chat_s": chat_s, "drain_s": drain_s,
        "enqueue_late_max_ms": late_ms,
        "max_turns_waiting": backlog.max_turns, "max_memory_queued": backlog.max_jobs,
        "backlog_every_30s": backlog.series,
        "memory": memory_json(memory, chat_window_s, lane),
    }))
}

/// Sends each session's line on the clock of [`schedule`]; returns the turn ids and how late
/// the latest enqueue was.
async fn open_loop(
    plan: &Plan,
    pool: &PgPool,
    worker: &mut Worker,
    chars: &[i64],
) -> Result<(Vec<i64>, f64)> {
    let events = schedule(plan);
    let start = Instant::now();
    let mut ids = Vec::with_capacity(events.len());
    let mut late_ms: f64 = 0.0;
    for &(at, s, k) in &events {
        let due = start + Duration::from_secs_f64(at);
        tokio::time::sleep_until(due).await;
        late_ms = late_ms.max(due.elapsed().as_secs_f64() * 1000.0);
        worker.check_alive()?;
        ids.push(enqueue(pool, s, k, chars[s]).await?);
    }
    Ok((ids, late_ms))
}

/// Each session sends its next line once its last turn is done, until the phase's time is
/// up; returns the turn ids. The worker always has a turn waiting, so what it serves is
/// its saturation rate.
async fn closed_loop(
    plan: &Plan,
    pool: &PgPool,
    worker: &mut Worker,
    chars: &[i64],
) -> Result<Vec<i64>> {
    let end = Instant::now() + Duration::from_secs_f64(plan.phase_s());
    let mut sessions = tokio::task::JoinSet::new();
    for (s, &ch) in chars.iter().enumerate() {
        let pool = pool.clone();
        sessions.spawn(async move {
            let mut ids = Vec::new();
            for k in 0.. {
                if Instant::now() >= end {
                    break;
                }
                let id = enqueue(&pool, s, k, ch).await?;
                ids.push(id);
                // A client polling every 50 ms: the worker has other sessions' turns meanwhile.
                let (hour, poll) = (Duration::from_secs(3600), Duration::from_millis(50));
                common::wait_turn(&pool, id, hour, poll).await?;
            }
            anyhow::Ok(ids)
        });
    }
    let mut ids = Vec::new();
    loop {
        tokio::select! {
            joined = sessions.join_next() => match joined {
                Some(r) => ids.extend(r??),
                None => break,
            },
            _ = tokio::time::sleep(Duration::from_secs(1)) => worker.check_alive()?,
        }
    }
    Ok(ids)
}

async fn enqueue(pool: &PgPool, s: usize, k: usize, ch: i64) -> Result<i64> {
    // Sessions start at different lines, so users do not all say the same thing.
    let line = LINES[(s * 7 + k) % LINES.len()];
    Ok(
        sqlx::query_scalar("SELECT kvmem_enqueue_turn($1, $2, $3, $4)")
            .bind(format!("s{s}"))
            .bind(user(s))
            .bind(ch)
            .bind(line)
            .fetch_one(pool)
            .await?,
    )
}

/// The phase's worker: the same settings both phases but the memory lane.
fn spawn_worker(plan: &Plan, url: &str, kv: &std::path::Path, lane: bool) -> Result<Worker> {
    let lane_s = lane.to_string();
    Ok(Worker(
        Command::new(env!("CARGO_BIN_EXE_kvmem"))
            .arg("worker")
            .env("DATABASE_URL", url)
            .env("KVMEM_MODEL_PATH", &plan.model)
            .env("KVMEM_KV_DIR", kv)
            .env("KVMEM_MEMORY_LANE", &lane_s)
            .env("KVMEM_MEMORY_EXTRACT", &lane_s)
            .env("KVMEM_MEMORY_EMBED_MODEL_PATH", &plan.embedder)
            // Only the memory lane differs between phases: summaries stay off, and so
            // does recall in the turn, whose prompt would grow with the facts the lane
            // stores and blur the lane's own cost.
            .env("KVMEM_SUMMARY_LANE", "false")
            .env("MEMORY_MAX_TOKENS", "0")
            .env("REPLY_MAX_TOKENS", plan.reply_tokens.to_string())
            .env("KVMEM_POLL_MS", "100")
            .env("KVMEM_LOG_LEVEL", "warn")
            .spawn()
            .context("starting kvmem worker")?,
    ))
}
