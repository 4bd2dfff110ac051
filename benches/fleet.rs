//! The fleet, simulated on one machine: several `kvmem worker` processes, each with its own
//! snapshot cache directory, sharing one Postgres queue and one S3 bucket, run sessions of
//! turns with claim affinity on and off. It checks what a fleet must never break (every turn
//! done once, per-session order, one reply per turn) and reports where warm turns found
//! their snapshot and the turn latency. Run through `ops/fleet` (`--quick` in CI).
//!
//! `cargo bench --bench fleet -- [--quick] [--sessions N] [--turns N] [--workers N]
//! [--affinity on|off|both] [--wait-ms N]`

mod common;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use sqlx::PgPool;

struct Plan {
    sessions: usize,
    turns: usize,
    workers: usize,
    wait_ms: u64,
    model: PathBuf,
    base_url: String,
    endpoint: String,
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let num = |name: &str, quick_v: usize, full: usize| -> Result<usize> {
        match arg(name) {
            Some(v) => v.parse().with_context(|| format!("{name} {v}")),
            None => Ok(if quick { quick_v } else { full }),
        }
    };
    let plan = Plan {
        sessions: num("--sessions", 6, 50)?,
        turns: num("--turns", 4, 20)?,
        workers: num("--workers", 3, 3)?,
        wait_ms: num("--wait-ms", 30_000, 30_000)? as u64,
        model: PathBuf::from(
            std::env::var("KVMEM_FLEET_MODEL")
                .context("KVMEM_FLEET_MODEL is not set (ops/fleet sets it)")?,
        ),
        base_url: std::env::var("DATABASE_URL").context("DATABASE_URL is not set")?,
        endpoint: std::env::var("KVMEM_TEST_S3_ENDPOINT")
            .context("KVMEM_TEST_S3_ENDPOINT is not set (ops/fleet starts ops/s3)")?,
    };
    let modes: Vec<bool> = match arg("--affinity").as_deref().unwrap_or("both") {
        "on" => vec![true],
        "off" => vec![false],
        "both" => vec![true, false],
        other => anyhow::bail!("--affinity {other}: on, off or both"),
    };
    println!(
        "## Fleet: {} worker processes, {} sessions x {} turns, one S3 bucket ({})\n",
        plan.workers,
        plan.sessions,
        plan.turns,
        plan.model.file_name().unwrap_or_default().to_string_lossy()
    );
    let mut rows = Vec::new();
    for affinity in modes {
        rows.push(run(&plan, affinity).await?);
    }
    println!("| affinity | turns | cold | warm from cache | warm from bucket | cache share of warm | turn p50 ms | turn p95 ms | wait p50 ms | wait p95 ms | wall s |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {:.0}% | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} |",
            if r["affinity"].as_bool() == Some(true) {
                format!("on (wait {} ms)", plan.wait_ms)
            } else {
                "off".to_string()
            },
            r["turns"],
            r["cold"],
            r["cache"],
            r["remote"],
            r["cache_share"].as_f64().unwrap_or(0.0) * 100.0,
            r["turn_ms"]["p50"].as_f64().unwrap_or(0.0),
            r["turn_ms"]["p95"].as_f64().unwrap_or(0.0),
            r["wait_ms"]["p50"].as_f64().unwrap_or(0.0),
            r["wait_ms"]["p95"].as_f64().unwrap_or(0.0),
            r["wall_s"].as_f64().unwrap_or(0.0),
        );
    }
    let out = PathBuf::from("ops/bench-results");
    std::fs::create_dir_all(&out)?;
    let file = out.join(if quick {
        "fleet-quick.json"
    } else {
        "fleet.json"
    });
    std::fs::write(
        &file,
        serde_json::to_string_pretty(&json!({"suite": "fleet", "rows": rows}))?,
    )?;
    println!("\n_results in {}_", file.display());
    Ok(())
}

/// Kills the worker processes however the run ends.
struct Fleet(Vec<Child>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn run(plan: &Plan, affinity: bool) -> Result<Value> {
    let name = format!("kvmem_fleet_{}", if affinity { "on" } else { "off" });
    let (pool, url) = common::fresh_db(&plan.base_url, &name, 4).await?;
    let bucket = format!(
        "fleet-{}-{}",
        if affinity { "on" } else { "off" },
        std::process::id()
    );
    let created = reqwest::Client::new()
        .put(format!("{}/{bucket}", plan.endpoint))
        .send()
        .await
        .context("the S3 server")?;
    ensure!(
        created.status().is_success(),
        "create bucket: {}",
        created.status()
    );
    let ch = common::character(&pool, "fleet").await?;
    // Every turn enqueued up front, interleaved across sessions; the queue keeps each
    // session's turns in order and one at a time.
    sqlx::query(
        "SELECT kvmem_enqueue_turn('f' || s, 'fleet', $1, 'Turn ' || t || ': what do you see ahead?')
           FROM generate_series(1, $3) t, generate_series(1, $2) s ORDER BY t, s",
    )
    .bind(ch)
    .bind(plan.sessions as i32)
    .bind(plan.turns as i32)
    .execute(&pool)
    .await?;
    let caches = tempfile::tempdir()?;
    let threads =
        (std::thread::available_parallelism().map_or(2, |n| n.get()) / plan.workers).max(1);
    let t = Instant::now();
    let mut fleet = Fleet(Vec::new());
    for w in 0..plan.workers {
        let child = Command::new(env!("CARGO_BIN_EXE_kvmem"))
            .arg("worker")
            .env("DATABASE_URL", &url)
            .env("KVMEM_MODEL_PATH", &plan.model)
            .env("KVMEM_KV_DIR", caches.path().join(format!("w{w}")))
            .env("KVMEM_SNAPSHOT_STORE", "s3")
            .env("KVMEM_S3_ENDPOINT", &plan.endpoint)
            .env("KVMEM_S3_BUCKET", &bucket)
            .env("KVMEM_S3_ACCESS_KEY_ID", "fleet")
            .env("KVMEM_S3_SECRET_ACCESS_KEY", "fleet")
            .env("KVMEM_CLAIM_AFFINITY", affinity.to_string())
            .env("KVMEM_AFFINITY_WAIT_MS", plan.wait_ms.to_string())
            .env("KVMEM_N_THREADS", threads.to_string())
            .env("KVMEM_POLL_MS", "100")
            .env("REPLY_MAX_TOKENS", "24")
            .env("KVMEM_MEMORY_LANE", "false")
            .env("KVMEM_SUMMARY_LANE", "false")
            .env("KVMEM_MEMORY_MAX_TOKENS", "0")
            .env("KVMEM_LOG_LEVEL", "warn")
            .env("KVMEM_ENV", "test")
            .spawn()
            .context("starting kvmem worker")?;
        fleet.0.push(child);
    }
    let total = (plan.sessions * plan.turns) as i64;
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let (done, failed): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state IN ('failed', 'dead')) FROM turns",
        )
        .fetch_one(&pool)
        .await?;
        ensure!(failed == 0, "{failed} turns failed");
        if done == total {
            break;
        }
        for child in &mut fleet.0 {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("a worker exited early: {status}");
            }
        }
        ensure!(
            Instant::now() < deadline,
            "the fleet did not finish: {done} of {total} turns"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wall_s = t.elapsed().as_secs_f64();
    drop(fleet);
    check_invariants(&pool, total).await?;
    let (cold, cache, remote): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE cold), count(*) FILTER (WHERE kv_source = 'cache'),
                count(*) FILTER (WHERE kv_source = 'remote')
           FROM turn_log WHERE status = 'OK'",
    )
    .fetch_one(&pool)
    .await?;
    let turn_ms: Vec<f64> =
        sqlx::query_scalar("SELECT latency_ms::float8 FROM turn_log WHERE status = 'OK'")
            .fetch_all(&pool)
            .await?;
    // Queue wait: from the moment the session's previous turn finished (or the run
    // started, for a first turn) to this turn's start.
    let wait_ms: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM started_at - coalesce(prev, started_at))::float8 * 1000
           FROM (SELECT started_at, lag(finished_at) OVER (PARTITION BY sid ORDER BY started_at) AS prev
                   FROM turn_log WHERE status = 'OK') l
          WHERE prev IS NOT NULL",
    )
    .fetch_all(&pool)
    .await?;
    let warm = (cache + remote).max(1) as f64;
    let by_worker: Vec<(String, i64)> = sqlx::query_as(
        "SELECT worker_id, count(*) FROM turn_log WHERE status = 'OK' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&pool)
    .await?;
    pool.close().await;
    Ok(json!({
        "affinity": affinity, "wait_ms_setting": plan.wait_ms, "workers": plan.workers,
        "sessions": plan.sessions, "turns": total, "cold": cold, "cache": cache, "remote": remote,
        "cache_share": cache as f64 / warm,
        "turn_ms": common::pcts(turn_ms), "wait_ms": common::pcts(wait_ms), "wall_s": wall_s,
        "turns_by_worker": by_worker.into_iter().map(|(w, n)| json!({"worker": w, "turns": n})).collect::<Vec<_>>(),
    }))
}

/// What a fleet must never break: each turn done once with one reply, in session order,
/// never two turns of a session at once.
async fn check_invariants(pool: &PgPool, total: i64) -> Result<()> {
    let (ok_runs, replies, violations): (i64, i64, i64) = sqlx::query_as(
        "WITH l AS (SELECT sid, turn_id, started_at, finished_at,
                      lag(turn_id) OVER w AS prev_id, lag(finished_at) OVER w AS prev_end
                 FROM turn_log WHERE status = 'OK' WINDOW w AS (PARTITION BY sid ORDER BY started_at))
         SELECT (SELECT count(*) FROM l),
                (SELECT count(*) FROM messages WHERE role = 'assistant'),
                (SELECT count(*) FROM l WHERE prev_id > turn_id OR prev_end > started_at)",
    )
    .fetch_one(pool)
    .await?;
    ensure!(
        ok_runs == total,
        "{ok_runs} successful runs for {total} turns"
    );
    ensure!(replies == total, "{replies} replies for {total} turns");
    ensure!(violations == 0, "{violations} order or overlap violations");
    Ok(())
}
