//! The queue suites: start latency, throughput against graphile-worker, and growth.

use super::*;

/// Enqueues sessions × turns through the SQL API, then runs an echo worker until done.
pub(super) async fn echo_run(
    pool: &PgPool,
    sessions: usize,
    turns: usize,
    concurrency: u32,
    claim_batch: u32,
    prefix: &str,
) -> Result<Value> {
    let ch = character(pool).await?;
    let t = Instant::now();
    // One statement per turn, exactly the backend's call; turns interleave across sessions.
    sqlx::query(
        "SELECT kvmem_enqueue_turn($1 || s, 'bench', $2, 'turn ' || t)
           FROM generate_series(1, $4) t, generate_series(1, $3) s ORDER BY t, s",
    )
    .bind(prefix)
    .bind(ch)
    .bind(sessions as i32)
    .bind(turns as i32)
    .execute(pool)
    .await?;
    let enqueue_s = t.elapsed().as_secs_f64();
    let settings = Settings::defaults()
        .with(json!({"concurrency": concurrency, "claim_batch": claim_batch, "poll_ms": 50, "log_level": "warn"}))?;
    let deps = system::App::on(pool.clone(), Arc::new(settings)).deps(
        Model::Echo {
            delay: Duration::ZERO,
        },
        format!("bench-{prefix}{concurrency}"),
    )?;
    let shutdown = CancellationToken::new();
    let total = (sessions * turns) as i64;
    // Timed as graphile-worker is (`ops/bench-graphile/bench.mjs`): from just before the
    // worker starts to the last completion committed, heard on kvmem_turn_done (sent at
    // commit). Every turn of the run announces itself once.
    let mut done = sqlx::postgres::PgListener::connect_with(pool).await?;
    done.listen("kvmem_turn_done").await?;
    let t = Instant::now();
    let handle = tokio::spawn(runner::run(deps, shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let mut heard = 0i64;
    while heard < total {
        let note = tokio::time::timeout_at(deadline, done.recv())
            .await
            .map_err(|_| anyhow::anyhow!("echo run stuck: {heard} of {total} turns done"))??;
        let sent: Value = serde_json::from_str(note.payload())?;
        if sent["session_id"]
            .as_str()
            .is_some_and(|sid| sid.starts_with(prefix))
        {
            heard += 1;
        }
    }
    let run_s = t.elapsed().as_secs_f64();
    shutdown.cancel();
    let _ = handle.await;
    let (span_s, violations, runs): (f64, i64, i64) = sqlx::query_as(
        "WITH l AS (SELECT sid, turn_id, started_at, finished_at,
                      lag(turn_id) OVER w AS prev_id, lag(finished_at) OVER w AS prev_end
                 FROM turn_log WHERE sid LIKE $1 || '%' WINDOW w AS (PARTITION BY sid ORDER BY started_at))
         SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8,
                count(*) FILTER (WHERE prev_id > turn_id OR prev_end > started_at),
                count(*)
           FROM l",
    )
    .bind(prefix)
    .fetch_one(pool)
    .await?;
    anyhow::ensure!(runs == total, "{runs} runs logged for {total} turns");
    Ok(
        json!({"sessions": sessions, "turns": turns, "concurrency": concurrency, "claim_batch": claim_batch, "total": total,
        "enqueue_s": enqueue_s, "run_s": run_s, "first_start_to_last_finish_s": span_s,
        "turns_per_s": total as f64 / run_s,
        "order_or_overlap_violations": violations}),
    )
}

/// Enqueue-to-start latency on an idle worker: single turns, spaced, through NOTIFY.
pub(super) async fn start_latency(pool: &PgPool, n: usize) -> Result<(f64, f64)> {
    let ch = character(pool).await?;
    let settings = Settings::defaults()
        .with(json!({"concurrency": 1, "poll_ms": 5000, "log_level": "warn"}))?;
    let deps = system::App::on(pool.clone(), Arc::new(settings)).deps(
        Model::Echo {
            delay: Duration::ZERO,
        },
        "lat".into(),
    )?;
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(runner::run(deps, shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..n {
        kvmem::queue::enqueue(pool, &format!("lat{i}"), "bench", ch, "ping", None).await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    let _ = handle.await;
    let mut lat: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM started_at - created_at)::float8 * 1000 FROM turns WHERE session_id LIKE 'lat%' AND started_at IS NOT NULL",
    )
    .fetch_all(pool)
    .await?;
    anyhow::ensure!(
        lat.len() == n,
        "only {} of {n} latency turns ran",
        lat.len()
    );
    Ok((pct(&mut lat, 0.5), pct(&mut lat, 0.99)))
}

pub(super) fn graphile(url: &str, sessions: usize, jobs: usize, mode: &str) -> Result<Value> {
    let script = Path::new("ops/bench-graphile/run");
    if !script.exists() {
        return Ok(json!({"skipped": "ops/bench-graphile/run is missing"}));
    }
    let out = std::process::Command::new(script)
        .args([
            "--url",
            url,
            "--sessions",
            &sessions.to_string(),
            "--jobs",
            &jobs.to_string(),
            "--concurrency",
            "4",
            "--mode",
            mode,
            "--timeout",
            "300",
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or("{}");
    Ok(serde_json::from_str(last)
        .unwrap_or_else(|_| json!({"error": String::from_utf8_lossy(&out.stderr).to_string()})))
}

pub(super) async fn queue(env: &Env) -> Result<Value> {
    let (sessions, turns) = if env.quick { (200, 5) } else { (1000, 10) };
    let (pool, url) = fresh_db(env, "kvmem_bench_queue").await?;
    println!("## Queue throughput, echo generator ({sessions} sessions × {turns} turns, strict per-session order)\n");
    println!("| system | workers | turns/s | run s | violations |\n|---|---:|---:|---:|---:|");
    let mut runs = Vec::new();
    // (workers, claim_batch): 0 claims only what can start; 500 prefetches like
    // graphile-worker's localQueue of 500.
    for (c, batch) in [(1u32, 0u32), (2, 0), (4, 0), (4, 500)] {
        let r = echo_run(&pool, sessions, turns, c, batch, &format!("q{c}b{batch}_")).await?;
        let label = if batch > 0 {
            format!("kvmem (claim_batch {batch})")
        } else {
            "kvmem".to_string()
        };
        println!(
            "| {label} | {c} | {:.0} | {:.2} | {} |",
            r["turns_per_s"].as_f64().unwrap_or(0.0),
            r["run_s"].as_f64().unwrap_or(0.0),
            r["order_or_overlap_violations"]
        );
        runs.push(r);
    }
    let mut peers = Vec::new();
    for mode in ["default", "fast"] {
        let g = graphile(&url, sessions, turns, mode)?;
        println!(
            "| graphile-worker ({mode}) | 4 | {:.0} | {:.2} | {} |",
            g["jobs_per_s"].as_f64().unwrap_or(0.0),
            g["run_s"].as_f64().unwrap_or(0.0),
            g.get("order_violations")
                .map_or("?".to_string(), |v| format!(
                    "{} (+{} overlaps){}",
                    v,
                    g["overlaps"],
                    if g["hung"] == true { ", hung" } else { "" }
                ))
        );
        peers.push(json!({"mode": mode, "result": g}));
    }
    let (p50, p99) = start_latency(&pool, if env.quick { 100 } else { 500 }).await?;
    println!("\nenqueue-to-start latency (idle worker, NOTIFY): p50 {p50:.2} ms, p99 {p99:.2} ms");
    let rate = |v: &Value| v["turns_per_s"].as_f64().unwrap_or(0.0);
    let (k4, k4b) = (rate(&runs[2]), rate(&runs[3]));
    for p in &peers {
        let g = p["result"]["jobs_per_s"].as_f64().unwrap_or(0.0);
        let mode = p["mode"].as_str().unwrap_or("");
        if g > 0.0 {
            println!("kvmem(4) / graphile-worker({mode}) = {:.2}", k4 / g);
            println!(
                "kvmem(4, claim_batch 500) / graphile-worker({mode}) = {:.2}",
                k4b / g
            );
        }
    }
    println!();
    let history = history_growth(env, sessions, turns).await?;
    Ok(
        json!({"suite": "queue", "kvmem": runs, "graphile_worker": peers, "start_latency_ms": {"p50": p50, "p99": p99},
        "with_history": history}),
    )
}

/// The same echo run with 10k and then 1M finished turns already stored, in a database of
/// its own, to show how the queue's cost grows with history.
pub(super) async fn history_growth(env: &Env, sessions: usize, turns: usize) -> Result<Value> {
    let (pool, _) = fresh_db(env, "kvmem_bench_history").await?;
    character(&pool).await?;
    let sizes: &[i64] = if env.quick {
        &[10_000, 100_000]
    } else {
        &[10_000, 1_000_000]
    };
    println!("## Queue throughput with finished turns in the table (4 workers)\n");
    println!("| finished turns | claim_batch | turns/s | run s | violations |\n|---:|---:|---:|---:|---:|");
    let mut stored = 0i64;
    let mut out = Vec::new();
    for &size in sizes {
        let t = Instant::now();
        sqlx::query(
            "INSERT INTO turns (session_id, user_id, character_id, message, state, reply, finished_at)
             SELECT 'old' || (g % 10000), 'bench', (SELECT min(id) FROM user_characters), 'old', 'done', 'old', now()
               FROM generate_series(1, $1) g",
        )
        .bind(size - stored)
        .execute(&pool)
        .await?;
        // Settle the fill before measuring: statistics, visibility map, and a checkpoint
        // so the run does not pay for the fill's dirty pages.
        sqlx::query("VACUUM ANALYZE turns").execute(&pool).await?;
        sqlx::query("CHECKPOINT").execute(&pool).await?;
        let fill_s = t.elapsed().as_secs_f64();
        stored = size;
        for batch in [0u32, 500] {
            let r = echo_run(
                &pool,
                sessions,
                turns,
                4,
                batch,
                &format!("h{size}b{batch}_"),
            )
            .await?;
            println!(
                "| {size} | {batch} | {:.0} | {:.2} | {} |",
                r["turns_per_s"].as_f64().unwrap_or(0.0),
                r["run_s"].as_f64().unwrap_or(0.0),
                r["order_or_overlap_violations"]
            );
            out.push(json!({"finished_turns": size, "fill_s": fill_s, "result": r}));
            stored += (sessions * turns) as i64;
        }
    }
    println!();
    Ok(Value::Array(out))
}

pub(super) async fn growth(env: &Env) -> Result<Value> {
    let turns = if env.quick { 40 } else { 200 };
    let kv_dir = tempdir("growth")?;
    let s = Settings::defaults().with(json!({"kv_dir": kv_dir, "kv_tail_tokens": 1024, "reply_max_tokens": 24, "log_level": "warn"}))?;
    let engine = Arc::new(kvmem::system::load_engine(
        &env.smollm2,
        None,
        EngineParams::from_settings(&s),
    )?);
    let (pool, _) = fresh_db(env, "kvmem_bench_growth").await?;
    let ch = character(&pool).await?;
    let lane = kvmem::system::memory_lane_service(pool.clone(), &s, None, None).await?;
    let deps = llama_deps(&pool, s, engine)?;
    for i in 0..turns {
        let (u, _) = filler(i);
        timed_turn(&deps, &lane, "grow", ch, &u).await?;
    }
    let rows: Vec<(i32, i64, i32)> =
        sqlx::query_as("SELECT tokens_in_kv, kv_bytes, latency_ms FROM turn_log WHERE sid = 'grow' ORDER BY turn_id")
            .fetch_all(&pool)
            .await?;
    println!("## Growth over a {turns}-turn session (SmolLM2, KV_TAIL_TOKENS=1024)\n");
    println!("| turns | tokens_in_kv (max) | kv_bytes (max) | latency ms (median) |\n|---|---:|---:|---:|");
    let step = turns / 10;
    let mut buckets = Vec::new();
    for b in 0..10 {
        let chunk = &rows[b * step..((b + 1) * step).min(rows.len())];
        let tk = chunk.iter().map(|r| r.0).max().unwrap_or(0);
        let kb = chunk.iter().map(|r| r.1).max().unwrap_or(0);
        let mut l: Vec<f64> = chunk.iter().map(|r| r.2 as f64).collect();
        let ml = median(&mut l);
        println!(
            "| {}–{} | {tk} | {kb} | {ml:.0} |",
            b * step + 1,
            (b + 1) * step
        );
        buckets.push(json!({"from": b * step + 1, "to": (b + 1) * step, "tokens_in_kv_max": tk, "kv_bytes_max": kb, "latency_ms_median": ml}));
    }
    println!();
    let _ = std::fs::remove_dir_all(&kv_dir);
    Ok(json!({"suite": "growth", "turns": turns, "buckets": buckets}))
}
