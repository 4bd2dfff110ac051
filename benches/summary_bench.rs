//! Summary benchmarks (issue 14): how long each summary kind takes on SmolLM2, and live-turn
//! latency with and without a summary backlog on the same worker. Numbers, never
//! assertions; the machine is shared, so both latency phases run in one process, one after
//! the other. Run through `ops/bench-summary`.
//!
//! `cargo bench --bench summary_bench -- [kinds] [latency]`

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chrono::{DateTime, TimeZone, Utc};
use kvmem::config::Settings;
use kvmem::engine::EngineParams;
use kvmem::summary::{compaction, daily, jobs, SummaryConfig, SummaryService};
use kvmem::system::{self, Model};
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

struct Env {
    base_url: String,
    smollm2: std::path::PathBuf,
    runs: usize,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
    let env = Env {
        base_url: std::env::var("DATABASE_URL")
            .context("DATABASE_URL (ops/bench-summary sets it)")?,
        smollm2: std::env::var("KVMEM_BENCH_MODEL")
            .context("KVMEM_BENCH_MODEL (ops/bench-summary sets it)")?
            .into(),
        runs: std::env::var("KVMEM_BENCH_RUNS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(3),
    };
    let all = ["kinds", "latency"];
    let suites: Vec<&str> = match args.is_empty() {
        true => all.to_vec(),
        false => args.iter().map(String::as_str).collect(),
    };
    let mut results = serde_json::Map::new();
    for suite in suites {
        let value = match suite {
            "kinds" => kinds(&env).await?,
            "latency" => latency(&env).await?,
            other => anyhow::bail!("unknown suite {other}; suites: {all:?}"),
        };
        results.insert(suite.into(), value);
    }
    let out = std::path::Path::new("ops/bench-results");
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    Ok(())
}

fn settings() -> Result<Settings> {
    Ok(Settings::defaults().with(json!({
        "n_ctx": 4096, "kv_tail_tokens": 1024, "reply_max_tokens": 32, "log_level": "warn",
        "poll_ms": 100, "memory_lane": false, "summary_lane": true, "concurrency": 1,
    }))?)
}

/// A fresh, migrated database for one suite.
async fn fresh_db(env: &Env, name: &str) -> Result<PgPool> {
    Ok(common::fresh_db(&env.base_url, name, 16).await?.0)
}

/// Varied dialogue about one user's week, so every summary has something to say.
fn line(i: usize) -> (String, String) {
    const TOPICS: [&str; 8] = [
        "moved to Porto with my sister Ana",
        "need to find a flat near the river",
        "promised Ana to visit three flats on Saturday",
        "start a nursing job next week and feel nervous",
        "went running along the river this morning",
        "my friend Rui is helping me paint the kitchen",
        "the landlord has not answered my email yet",
        "booked a Portuguese class for Tuesday evenings",
    ];
    (
        format!("Today I {}.", TOPICS[i % TOPICS.len()]),
        "That sounds important. Tell me more about it.".into(),
    )
}

/// A done live turn and its two messages at `when`, as the completion writes them.
async fn turn(pool: &PgPool, user: &str, ch: i64, when: DateTime<Utc>, i: usize) -> Result<()> {
    let (u, a) = line(i);
    let sid = format!("chat-{user}");
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO turns (session_id, user_id, character_id, message, state, reply)
         VALUES ($1, $2, $3, $4, 'done', $5) RETURNING id",
    )
    .bind(&sid)
    .bind(user)
    .bind(ch)
    .bind(&u)
    .bind(&a)
    .fetch_one(pool)
    .await?;
    sqlx::query(
        "INSERT INTO messages (session_id, turn_id, role, content, created_at)
         VALUES ($1, $2, 'user', $3, $5), ($1, $2, 'assistant', $4, $5)",
    )
    .bind(&sid)
    .bind(id)
    .bind(&u)
    .bind(&a)
    .bind(when)
    .execute(pool)
    .await?;
    Ok(())
}

/// A user and character with `n` turns a minute apart from `t0`.
async fn user_with_turns(pool: &PgPool, user: &str, t0: DateTime<Utc>, n: usize) -> Result<i64> {
    let ch = common::character(pool, user).await?;
    for i in 0..n {
        turn(pool, user, ch, t0 + chrono::Duration::minutes(i as i64), i).await?;
    }
    Ok(ch)
}

fn median(v: &mut [f64]) -> f64 {
    pct(v, 0.5)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    match v.is_empty() {
        true => 0.0,
        false => v[((v.len() as f64 - 1.0) * p).round() as usize],
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Each summary kind `env.runs` times on SmolLM2, timed around the library call that makes
/// it (model time plus its few queries).
async fn kinds(env: &Env) -> Result<Value> {
    let engine = Arc::new(kvmem::system::load_engine(
        &env.smollm2,
        None,
        EngineParams::from_settings(&settings()?),
    )?);
    let pool = fresh_db(env, "kvmem_bench_summary_kinds").await?;
    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    for run in 0..env.runs {
        let svc =
            kvmem::system::summary_service_on(pool.clone(), config(), Some(engine.clone()), None)?;
        let t = lane_kinds(&svc, run).await?;
        let d = day_kinds(&svc, run).await?;
        let c = compact_kind(&svc, run).await?;
        for (kind, v) in t.into_iter().chain(d).chain(c) {
            match rows.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, all)) => all.push(v),
                None => rows.push((kind.to_string(), vec![v])),
            }
        }
    }
    println!(
        "## Summary kinds on SmolLM2-135M Q4_1 ({} runs each)\n",
        env.runs
    );
    println!("| kind | n | median ms | min ms | max ms |\n|---|---:|---:|---:|---:|");
    let mut out = Vec::new();
    for (kind, mut v) in rows {
        let (med, lo, hi) = (median(&mut v), v[0], v[v.len() - 1]);
        println!("| {kind} | {} | {med:.0} | {lo:.0} | {hi:.0} |", v.len());
        out.push(json!({"kind": kind, "median_ms": med, "min_ms": lo, "max_ms": hi, "n": v.len()}));
    }
    println!();
    Ok(json!({"model": env.smollm2, "rows": out}))
}

fn config() -> SummaryConfig {
    SummaryConfig::from_settings(&settings().expect("settings"))
}

/// Rolling (4 turns), session (close, then JSON) and spine (20 messages) on the lane.
async fn lane_kinds(svc: &SummaryService, run: usize) -> Result<Vec<(String, f64)>> {
    let user = format!("lane{run}");
    let t0 = Utc.with_ymd_and_hms(2026, 3, 10, 9, 0, 0).unwrap();
    user_with_turns(&svc.pool, &user, t0, 20).await?;
    let mut out = Vec::new();
    let now = t0 + chrono::Duration::hours(2);
    loop {
        let started = Instant::now();
        let o = jobs::process_next_summary_job_at(svc, now).await?;
        let took = ms(started.elapsed());
        match o {
            jobs::Outcome::Empty => return Ok(out),
            jobs::Outcome::Done { kind, result, .. } if kind != "close" => {
                let label = match result["attempts"].as_i64() {
                    Some(n) => format!("{kind} (made on attempt {n})"),
                    None => format!("{kind} (made)"),
                };
                out.push((label, took));
            }
            jobs::Outcome::Failed { kind, .. } => {
                out.push((format!("{kind} (refused, stored as an error)"), took));
            }
            jobs::Outcome::Done { .. } => {}
            jobs::Outcome::Busy | jobs::Outcome::Erased { .. } => {}
        }
    }
}

/// Seed 004's levels for one user over a week: a past day's batch, the current day's
/// batch, days 2–7 (its six past days made first, so the call times one model call), and
/// the 3-way merge (the three inputs cached, so the call times the merge alone).
async fn day_kinds(svc: &SummaryService, run: usize) -> Result<Vec<(String, f64)>> {
    let user = format!("day{run}");
    let now = Utc.with_ymd_and_hms(2026, 3, 10, 18, 0, 0).unwrap();
    for d in 0..7 {
        for i in 0..4 {
            sqlx::query(
                "INSERT INTO memory_messages (user_id, session_id, message_id, speaker, text, at)
                 VALUES ($1, 's', $2, 'user', $3, $4)",
            )
            .bind(&user)
            .bind(format!("m{d}-{i}"))
            .bind(line(d * 4 + i).0)
            .bind(now - chrono::Duration::days(d as i64) - chrono::Duration::hours(i as i64 + 1))
            .execute(&svc.pool)
            .await?;
        }
    }
    sqlx::query("INSERT INTO memory_blobs (user_id, guild_id, blob) VALUES ($1, '', $2)")
        .bind(&user)
        .bind(format!("{user} is a nurse who lives in Porto."))
        .execute(&svc.pool)
        .await?;
    let batch = daily::Batch::of("", &user);
    let mut out = Vec::new();
    let days = daily::historical_days(now);
    let started = Instant::now();
    daily::day_summaries(svc, &batch, days[5], now).await?;
    out.push(("daily (past day, 1 user)", ms(started.elapsed())));
    for d in &days[..5] {
        daily::day_summaries(svc, &batch, *d, now).await?;
    }
    let started = Instant::now();
    daily::day_summaries(svc, &batch, now.date_naive(), now).await?;
    out.push(("daily (current day, 1 user)", ms(started.elapsed())));
    let started = Instant::now();
    daily::historical(svc, "", &user, now).await?;
    out.push(("historical (days 2-7)", ms(started.elapsed())));
    let started = Instant::now();
    let c = daily::user_context(svc, "", &user, now).await?;
    out.push(("3-way merge", ms(started.elapsed())));
    if !c.degraded.is_empty() {
        println!("note: run {run} degraded: {:?}", c.degraded);
    }
    Ok(out.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// Compaction of a 52-entry chat history: one model call over the 22 oldest.
async fn compact_kind(svc: &SummaryService, run: usize) -> Result<Vec<(String, f64)>> {
    let user = format!("compact{run}");
    let t0 = Utc.with_ymd_and_hms(2026, 3, 1, 9, 0, 0).unwrap();
    user_with_turns(&svc.pool, &user, t0, 26).await?;
    // This user's own lane jobs would be timed by the next run's lane loop.
    sqlx::query("DELETE FROM summary_jobs WHERE user_id = $1")
        .bind(&user)
        .execute(&svc.pool)
        .await?;
    let started = Instant::now();
    let r = compaction::compact_session(svc, &format!("chat-{user}"), t0.timestamp()).await?;
    let took = ms(started.elapsed());
    if r.model_fallback {
        println!("note: run {run} compaction fell back to the bullet list");
    }
    Ok(vec![("compaction (22 of 52 entries)".into(), took)])
}

/// Live-turn latency on one llama worker (concurrency 1, summary lane on): first with the
/// summary lane empty, then with a backlog of other users' summaries due. A turn every
/// second or so, as a person types; the lane may start a job in the gaps.
async fn latency(env: &Env) -> Result<Value> {
    let settings =
        settings()?.with(json!({"kv_dir": std::env::temp_dir().join("kvmem-bench-summary-kv")}))?;
    let engine = Arc::new(kvmem::system::load_engine(
        &env.smollm2,
        None,
        EngineParams::from_settings(&settings),
    )?);
    let pool = fresh_db(env, "kvmem_bench_summary_latency").await?;
    set_triggers(&pool, 1000, 1000).await?;
    let ch = common::character(&pool, "live").await?;
    let deps = system::App::on(pool.clone(), Arc::new(settings))
        .deps(Model::Llama(engine), "bench".into())?;
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(kvmem::runner::run(deps, shutdown.clone()));
    let n = env.runs.max(3) * 4;
    // Each phase is a new session fed the same messages, so turn i of both phases has
    // the same prompt, the same KV length and the same prunes: the only difference is
    // the backlog. (One session running on would give the second phase longer contexts.)
    phase(&pool, ch, "warm-up", "live-warm-up", 3).await?;
    let quiet = phase(&pool, ch, "no backlog", "live-quiet", n).await?;
    set_triggers(&pool, 4, 20).await?;
    let queued = backlog(&pool, 40).await?;
    let busy = phase(&pool, ch, "backlog", "live-busy", n).await?;
    let mut delta: Vec<f64> = quiet
        .turn_ms
        .iter()
        .zip(&busy.turn_ms)
        .map(|(q, b)| b - q)
        .collect();
    let (d50, dmax) = (pct(&mut delta, 0.5), pct(&mut delta, 1.0));
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM summary_jobs WHERE state = 'queued' AND run_at <= now()",
    )
    .fetch_one(&pool)
    .await?;
    shutdown.cancel();
    let _ = worker.await;
    println!("## Live-turn latency with and without a summary backlog (SmolLM2, 1 worker, concurrency 1)\n");
    println!(
        "backlog: {queued} summary jobs due when the phase started, {left} still due at its end\n"
    );
    println!("| phase | turns | turn ms p50 | turn ms p95 | enqueue→done ms p50 | enqueue→done ms p95 | turns overlapping a summary job |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let rows: Vec<Value> = [quiet, busy].into_iter().map(print_phase).collect();
    println!(
        "\nper turn, backlog minus no backlog (same message, same KV length): median {d50:.0} ms, max {dmax:.0} ms\n"
    );
    Ok(
        json!({"backlog_jobs": queued, "backlog_left": left, "phases": rows,
        "paired_delta_ms_p50": d50, "paired_delta_ms_max": dmax}),
    )
}

async fn set_triggers(pool: &PgPool, rolling: i32, spine: i32) -> Result<()> {
    for (key, v) in [
        ("summary_rolling_every", rolling),
        ("summary_spine_every", spine),
    ] {
        sqlx::query("UPDATE kvmem_config SET value = $2 WHERE key = $1")
            .bind(key)
            .bind(v.to_string())
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// `users` other users with four turns an hour ago: each queues a rolling summary, and its
/// session is past the idle deadline, so a close and a session summary follow.
async fn backlog(pool: &PgPool, users: usize) -> Result<i64> {
    let when = Utc::now() - chrono::Duration::hours(1);
    for u in 0..users {
        let user = format!("backlog{u}");
        let ch = common::character(pool, &user).await?;
        for i in 0..4 {
            turn(
                pool,
                &user,
                ch,
                when + chrono::Duration::seconds(i as i64),
                u + i,
            )
            .await?;
        }
    }
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM summary_jobs WHERE state = 'queued' AND run_at <= now()",
    )
    .fetch_one(pool)
    .await?)
}

struct Phase {
    name: &'static str,
    turn_ms: Vec<f64>,
    e2e_ms: Vec<f64>,
    overlapping: usize,
}

/// `n` live turns, one at a time with a pause between them; per turn the worker's own
/// latency (turn_log), the wall time from enqueue to done, and whether a summary job ran
/// during it.
async fn phase(
    pool: &PgPool,
    ch: i64,
    name: &'static str,
    session: &str,
    n: usize,
) -> Result<Phase> {
    let mut p = Phase {
        name,
        turn_ms: Vec::new(),
        e2e_ms: Vec::new(),
        overlapping: 0,
    };
    for i in 0..n {
        let enqueued = Utc::now();
        let started = Instant::now();
        let id = kvmem::queue::enqueue(pool, session, "live", ch, &line(i).0, None).await?;
        wait_done(pool, id.0).await?;
        p.e2e_ms.push(ms(started.elapsed()));
        let latency: i32 = sqlx::query_scalar(
            "SELECT latency_ms FROM turn_log WHERE turn_id = $1 ORDER BY id DESC LIMIT 1",
        )
        .bind(id.0)
        .fetch_one(pool)
        .await?;
        p.turn_ms.push(latency as f64);
        let overlap: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM summary_jobs WHERE started_at < now() AND coalesce(finished_at, now()) > $1)",
        )
        .bind(enqueued)
        .fetch_one(pool)
        .await?;
        p.overlapping += overlap as usize;
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    Ok(p)
}

async fn wait_done(pool: &PgPool, id: i64) -> Result<()> {
    common::wait_turn(pool, id, Duration::from_secs(300), Duration::from_millis(5)).await
}

fn print_phase(mut p: Phase) -> Value {
    let (t50, t95) = (pct(&mut p.turn_ms, 0.5), pct(&mut p.turn_ms, 0.95));
    let (e50, e95) = (pct(&mut p.e2e_ms, 0.5), pct(&mut p.e2e_ms, 0.95));
    println!(
        "| {} | {} | {t50:.0} | {t95:.0} | {e50:.0} | {e95:.0} | {} |",
        p.name,
        p.turn_ms.len(),
        p.overlapping
    );
    json!({"phase": p.name, "turns": p.turn_ms.len(), "turn_ms_p50": t50, "turn_ms_p95": t95,
        "e2e_ms_p50": e50, "e2e_ms_p95": e95, "overlapping": p.overlapping})
}
