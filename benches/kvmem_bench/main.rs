//! kvmem's benchmarks: warm vs cold turns, snapshot I/O phases, digest rebuild latency
//! (idle, and under load beside echo turns), queue throughput (side by side with
//! graphile-worker), growth, and memory in the turn (recall latency, tokens injected, warm
//! TTFT with memory on and off), sessions decoded together against one at a time, and
//! streamed replies (first content byte against TTFT, tokens/s with deltas on and off).
//! Ratios are measured in one run because the machine is shared and noisy. Run through
//! `ops/bench`.
//!
//! `cargo bench --bench kvmem_bench -- [warm-cold] [snapshot-io] [digest] [digest-load] [queue] [growth] [recall] [batch] [stream]`
//! and, on demand, `warm-cold-q4_0`: the warm-cold suite on SmolLM2 re-quantized to Q4_0,
//! `soak`, and `frontend`: requests matched by their history (warm share, match latency).

#[path = "../batching/mod.rs"]
mod batching;
#[path = "../common/mod.rs"]
mod common;
mod digest;
mod frontend;
mod queue;
mod recall;
mod soak;
#[path = "../streaming/mod.rs"]
mod streaming;
mod sweep;
mod warm_cold;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use digest::*;
use kvmem::config::Settings;
use kvmem::engine::{Engine, EngineParams, KvSession};
use kvmem::runner::{self, Deps, Outcome};
use kvmem::snapshot::{self, Limits, SegKind};
use kvmem::system::{self, Model};
use queue::*;
use recall::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use warm_cold::*;

struct Env {
    base_url: String,
    smollm2: PathBuf,
    results: PathBuf,
    quick: bool,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let quick = std::env::args().any(|a| a == "--quick");
    let all = [
        "warm-cold",
        "snapshot-io",
        "digest",
        "digest-load",
        "queue",
        "growth",
        "recall",
        "batch",
        "stream",
    ];
    let suites: Vec<&str> = if args.is_empty() {
        all.to_vec()
    } else {
        args.iter().map(String::as_str).collect()
    };
    llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
    let env = Env {
        base_url: std::env::var("DATABASE_URL").context("DATABASE_URL (ops/bench sets it)")?,
        smollm2: PathBuf::from(
            std::env::var("KVMEM_BENCH_MODEL").context("KVMEM_BENCH_MODEL (ops/bench sets it)")?,
        ),
        results: PathBuf::from(
            std::env::var("KVMEM_BENCH_OUT").unwrap_or_else(|_| "ops/bench-results".into()),
        ),
        quick,
    };
    std::fs::create_dir_all(&env.results)?;
    println!("# kvmem benchmarks\n\n{}\n", machine());
    for suite in suites {
        let started = Instant::now();
        let value = match suite {
            "warm-cold" => warm_cold(&env, &env.smollm2).await?,
            "warm-cold-q4_0" => {
                let path = std::env::var("KVMEM_BENCH_MODEL_Q4_0")
                    .context("KVMEM_BENCH_MODEL_Q4_0 (ops/bench sets it)")?;
                warm_cold(&env, Path::new(&path)).await?
            }
            "snapshot-io" => snapshot_io(&env)?,
            "digest" => digest_latency(&env).await?,
            "digest-load" => digest_load(&env).await?,
            "queue" => queue(&env).await?,
            "growth" => growth(&env).await?,
            "recall" => recall(&env).await?,
            "batch" => batching::batching(&env.smollm2, env.quick)?,
            "stream" => streaming::streaming(&env.base_url, &env.smollm2, env.quick).await?,
            "soak" => soak::soak(&env).await?,
            "frontend" => frontend::frontend(&env).await?,
            "erase-sweep" => sweep::sweep(&env).await?,
            other => anyhow::bail!("unknown suite {other}; suites: {all:?}"),
        };
        let path = env.results.join(format!("{suite}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&value)?)?;
        println!(
            "_{suite}: {:.0} s, results in {}_\n",
            started.elapsed().as_secs_f64(),
            path.display()
        );
    }
    Ok(())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "machine: {cores} cores, {cpu}; llama.cpp {}",
        kvmem::engine::LLAMA_BUILD
    )
}

/// A fresh, migrated database for one suite.
async fn fresh_db(env: &Env, name: &str) -> Result<(PgPool, String)> {
    common::fresh_db(&env.base_url, name, 16).await
}

async fn character(pool: &PgPool) -> Result<i64> {
    common::character(pool, "bench").await
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return 0.0;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn stats(v: &[f64]) -> Value {
    let mut s = v.to_vec();
    json!({ "median": median(&mut s), "min": s.first().copied().unwrap_or(0.0), "max": s.last().copied().unwrap_or(0.0), "n": s.len() })
}

/// Deterministic filler dialogue: varied words so the tokenizer sees realistic text.
fn filler(i: usize) -> (String, String) {
    const WORDS: [&str; 24] = [
        "convoy", "canyon", "engine", "shields", "guild", "credits", "orbit", "signal", "outpost",
        "pilot", "storm", "cargo", "reactor", "patrol", "beacon", "station", "harbor", "ridge",
        "relay", "scanner", "supply", "route", "drift", "anchor",
    ];
    let w = |k: usize| WORDS[(i * 7 + k * 5) % WORDS.len()];
    (
        format!("Turn {i}: what about the {} near the {} and the {}?", w(1), w(2), w(3)),
        format!(
            "The {} is steady. We keep the {} close to the {} and watch the {} until the {} clears.",
            w(4),
            w(5),
            w(6),
            w(7),
            w(8)
        ),
    )
}

/// Inserts done turns with messages until the dialogue is about `tokens` tokens long.
async fn seed_history(
    pool: &PgPool,
    engine: &Engine,
    sid: &str,
    ch: i64,
    tokens: usize,
) -> Result<usize> {
    let mut total = 0;
    let mut i = 0;
    while total < tokens {
        let (u, a) = filler(i);
        total += engine.block(&engine.frame.exchange, &[&u, &a]).len();
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO turns (session_id, user_id, character_id, message, state, reply, finished_at)
             VALUES ($1, 'bench', $2, $3, 'done', $4, now()) RETURNING id",
        )
        .bind(sid)
        .bind(ch)
        .bind(&u)
        .bind(&a)
        .fetch_one(pool)
        .await?;
        sqlx::query("INSERT INTO messages (session_id, turn_id, role, content) VALUES ($1, $2, 'user', $3), ($1, $2, 'assistant', $4)")
            .bind(sid)
            .bind(id)
            .bind(&u)
            .bind(&a)
            .execute(pool)
            .await?;
        i += 1;
    }
    Ok(total)
}

fn llama_deps(pool: &PgPool, settings: Settings, engine: Arc<Engine>) -> Result<Deps> {
    Ok(system::App::on(pool.clone(), Arc::new(settings))
        .deps(Model::Llama(engine), "bench".into())?)
}

/// Enqueues one turn and runs the queue until it is done.
async fn run_one(deps: &Deps, sid: &str, ch: i64, msg: &str) -> Result<kvmem::queue::TurnId> {
    let id = kvmem::queue::enqueue(&deps.pool, sid, "bench", ch, msg, None).await?;
    let never = CancellationToken::new();
    loop {
        match runner::process_next_turn(deps, &never).await? {
            Outcome::Done(t) if t == id => return Ok(id),
            Outcome::Empty => anyhow::bail!("turn {id} not runnable"),
            other if other == Outcome::Failed(id) => anyhow::bail!("turn {id} failed"),
            _ => {}
        }
    }
}

/// One turn's `turn_log` row, as the warm-cold suite reads it.
#[derive(sqlx::FromRow, Clone)]
struct TurnTimes {
    ttft_ms: i32,
    latency_ms: i32,
    cold: bool,
    tokens_loaded: i32,
    load_ms: i32,
    prefill_ms: i32,
    prefill_tokens: i32,
    generate_ms: i32,
    redecode_ms: i32,
    save_ms: i32,
}

/// Runs one turn through the queue, then the memory lane's jobs (the new messages'
/// embeddings) as a live worker runs them between turns (the lane's time is not the
/// turn's), and reads `columns` of the turn's log row.
async fn lane_turn<T>(
    deps: &Deps,
    lane: &kvmem::memory::MemoryService,
    (sid, ch, msg): (&str, i64, &str),
    columns: &str,
) -> Result<T>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    let id = run_one(deps, sid, ch, msg).await?;
    kvmem::memory::ingest::jobs::drain(lane).await?;
    Ok(sqlx::query_as(&format!(
        "SELECT {columns} FROM turn_log WHERE turn_id = $1 ORDER BY id DESC LIMIT 1"
    ))
    .bind(id.0)
    .fetch_one(&deps.pool)
    .await?)
}

/// One turn as the warm-cold and growth suites read it.
async fn timed_turn(
    deps: &Deps,
    lane: &kvmem::memory::MemoryService,
    sid: &str,
    ch: i64,
    msg: &str,
) -> Result<TurnTimes> {
    lane_turn(
        deps,
        lane,
        (sid, ch, msg),
        "ttft_ms, latency_ms, cold, tokens_loaded, load_ms, prefill_ms, prefill_tokens,
         generate_ms, redecode_ms, save_ms",
    )
    .await
}

/// `median [min–max]` of a sample.
fn spread(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.0} [{lo:.0}–{hi:.0}]", median(&mut v.to_vec()))
}

fn tempdir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("kvmem-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn header(kv: &str, compress: bool) -> snapshot::Header {
    snapshot::Header {
        format_version: snapshot::FORMAT_VERSION,
        model_sha: String::new(),
        digest_version: String::new(),
        crc32c: 0,
        tokens: 0,
        bytes: 0,
        stored_bytes: 0,
        timestamp: 0,
        llama_build: kvmem::engine::LLAMA_BUILD.into(),
        n_ctx: 4096,
        type_k: kv.into(),
        type_v: kv.into(),
        kv_device: snapshot::CPU_DEVICE.into(),
        compression: if compress {
            snapshot::Compression::Zstd
        } else {
            snapshot::Compression::None
        },
        scope: "io".into(),
        turn_id: 0,
        fence: 0,
        segments: Vec::new(),
    }
}
