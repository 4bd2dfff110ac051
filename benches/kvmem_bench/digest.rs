//! The digest suites: rebuild latency when idle, and under load beside echo turns.

use super::*;

pub(super) async fn digest_latency(env: &Env) -> Result<Value> {
    let n = if env.quick { 200 } else { 1000 };
    let (pool, _) = fresh_db(env, "kvmem_bench_digest").await?;
    let shutdown = CancellationToken::new();
    let tok: Arc<dyn kvmem::context::tokens::TokenCount> = Arc::new(kvmem::system::load_engine(
        &env.smollm2,
        None,
        EngineParams::from_settings(&Settings::defaults()),
    )?);
    // A 60 s poll: every rebuild measured here comes through NOTIFY.
    let task = tokio::spawn(kvmem::context::digest::run_rebuilder(
        pool.clone(),
        tok,
        180,
        Duration::from_secs(60),
        Arc::new(kvmem::metrics::Metrics::new()),
        shutdown.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let sid = format!("d{}", i % 10);
        let written: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
            "INSERT INTO facts (session_id, type, key, value) VALUES ($1, 'quest', 'q', $2)
             ON CONFLICT (session_id, type, key) DO UPDATE SET value = EXCLUDED.value, updated_at = clock_timestamp()
             RETURNING updated_at",
        )
        .bind(&sid)
        .bind(format!("Quest step {i}"))
        .fetch_one(&pool)
        .await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let at: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
                "SELECT updated_at FROM state_digest WHERE session_id = $1 AND digest_content = $2",
            )
            .bind(&sid)
            .bind(format!("Quest: Quest step {i}"))
            .fetch_optional(&pool)
            .await?;
            if let Some(at) = at {
                lat.push((at - written).num_microseconds().unwrap_or(0) as f64 / 1000.0);
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "rebuild {i} never arrived");
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    }
    shutdown.cancel();
    let _ = task.await;
    let (p50, p99) = (pct(&mut lat.clone(), 0.5), pct(&mut lat.clone(), 0.99));
    println!("## Digest rebuild latency (fact write → new state_digest row, via NOTIFY)\n");
    println!("| writes | p50 ms | p99 ms | max ms |\n|---:|---:|---:|---:|");
    println!(
        "| {n} | {p50:.2} | {p99:.2} | {:.2} |\n",
        pct(&mut lat.clone(), 1.0)
    );
    Ok(
        json!({"suite": "digest", "writes": n, "p50_ms": p50, "p99_ms": p99, "samples_ms": stats(&lat)}),
    )
}

/// The rebuild-lag goal under load: p99 fact write → new `state_digest` row.
pub(super) const DIGEST_LOAD_GOAL_MS: f64 = 10.0;

/// One fact write of the digest-load suite: its session, its step (the quest value it
/// wrote), when it was written (Postgres's clock inside the writing statement, before the
/// commit) and when its commit was acknowledged (the writer's clock, the same host's).
pub(super) struct FactWrite {
    session: usize,
    step: u64,
    at: chrono::DateTime<chrono::Utc>,
    committed: chrono::DateTime<chrono::Utc>,
}

/// The digest text a digest-load session has after writing quest step `step`: the bench
/// knows every fact it wrote, so it can tell which write a stored digest version reflects.
pub(super) fn digest_load_version(session: usize, step: u64) -> String {
    use kvmem::context::digest::{build, Fact};
    let fact = |t: &str, v: String| Fact {
        fact_type: t.into(),
        value: v,
        expires_at: None,
    };
    let facts = [
        fact("debt", format!("Owes {session} credits to First Bank")),
        fact("relationship", "Allied with Tech Syndicate".into()),
        fact("quest", format!("Quest step {step}")),
    ];
    build(
        &facts,
        chrono::Utc::now(),
        180,
        &kvmem::context::tokens::WordCount,
    )
    .version
}

/// Digest rebuilds under load: `sessions` sessions of three facts each, an open-loop
/// writer at 1,000 fact writes/s (a tenth of its picks are bursts of five writes to one
/// session, so coalescing shows), two rebuilders (the bench's, started as the `digest`
/// suite starts it, and the echo worker's own, as a second worker process would have),
/// and 4 echo workers running a backlog of turns over 2,000 of the sessions throughout.
/// The lag of a write runs from its statement to the first `digest_rebuilt` event whose
/// version is that of the write or a later write to the session: the rebuilder writes
/// that event with the new `state_digest` row, so nothing polls while the writer runs.
pub(super) async fn digest_load(env: &Env) -> Result<Value> {
    let (sessions, secs, turn_sessions, turns) = if env.quick {
        (2_000usize, 4u64, 500usize, 16usize)
    } else {
        (10_000, 20, 2_000, 20)
    };
    let rate = 1000u64;
    let (pool, url) = fresh_db(env, "kvmem_bench_digest_load").await?;
    sqlx::query(
        "INSERT INTO facts (session_id, type, key, value)
         SELECT 'dl' || s, f.type, f.key, replace(f.value, '#', s::text)
           FROM generate_series(0, $1 - 1) s,
                (VALUES ('debt', 'bank', 'Owes # credits to First Bank'),
                        ('relationship', 'syndicate', 'Allied with Tech Syndicate'),
                        ('quest', 'q', 'Quest step 0')) f(type, key, value)",
    )
    .bind(sessions as i64)
    .execute(&pool)
    .await?;
    let metrics = Arc::new(kvmem::metrics::Metrics::new());
    let words = kvmem::context::tokens::WordCount;
    let t = Instant::now();
    while kvmem::context::digest::rebuild_due(&pool, &words, 180, &metrics).await? > 0 {}
    let seed_s = t.elapsed().as_secs_f64();
    let ch = character(&pool).await?;
    sqlx::query(
        "SELECT kvmem_enqueue_turn('dl' || s, 'bench', $1, 'turn ' || t)
           FROM generate_series(1, $3) t, generate_series(0, $2 - 1) s ORDER BY t, s",
    )
    .bind(ch)
    .bind(turn_sessions as i32)
    .bind(turns as i32)
    .execute(&pool)
    .await?;

    let shutdown = CancellationToken::new();
    let shutdown_workers = shutdown.clone();
    let tok: Arc<dyn kvmem::context::tokens::TokenCount> = Arc::new(kvmem::system::load_engine(
        &env.smollm2,
        None,
        EngineParams::from_settings(&Settings::defaults()),
    )?);
    let rebuilder = tokio::spawn(kvmem::context::digest::run_rebuilder(
        pool.clone(),
        tok,
        180,
        Duration::from_secs(60),
        metrics.clone(),
        shutdown.clone(),
    ));
    // Profiling only: KVMEM_BENCH_ECHO_WORKERS=0 runs the writer beside the bench's
    // rebuilder alone, to tell the echo turns' share of the lag from the rebuild's own.
    let echo_workers: u32 = std::env::var("KVMEM_BENCH_ECHO_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let settings = Settings::defaults()
        .with(json!({"concurrency": echo_workers.max(1), "claim_batch": 0, "log_level": "warn"}))?;
    let deps = system::App::on(system::connect_url(&url, 16).await?, Arc::new(settings)).deps(
        Model::Echo {
            delay: Duration::ZERO,
        },
        "bench-digest-load".into(),
    )?;
    let workers = tokio::spawn(async move {
        if echo_workers > 0 {
            let _ = runner::run(deps, shutdown_workers).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    let writers = system::connect_url(&url, 32).await?;
    let server_now = "SELECT clock_timestamp()";
    let start: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar(server_now).fetch_one(&pool).await?;
    let t = Instant::now();
    let (writes, bursts) = digest_load_writer(&writers, sessions, rate, rate * secs).await?;
    let write_s = t.elapsed().as_secs_f64();
    let end: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar(server_now).fetch_one(&pool).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let dirty: i64 = sqlx::query_scalar("SELECT count(*) FROM digest_dirty")
            .fetch_one(&pool)
            .await?;
        if dirty == 0 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{dirty} digests still dirty 60 s after the last write"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A rebuild that cleared its marker may not have committed its row yet.
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.cancel();
    let _ = rebuilder.await;
    let _ = workers.await;

    let turns_done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM turn_log WHERE finished_at BETWEEN $1 AND $2")
            .bind(start)
            .bind(end)
            .fetch_one(&pool)
            .await?;
    let turns_left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM turns WHERE state IN ('queued', 'running')")
            .fetch_one(&pool)
            .await?;
    let events: Vec<(String, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT session_id, detail->>'digest_version', created_at FROM events
          WHERE kind = 'digest_rebuilt' AND created_at >= $1 ORDER BY created_at, id",
    )
    .bind(start)
    .fetch_all(&pool)
    .await?;
    let lags = digest_load_lags(&writes, &events);
    let n = writes.len();
    let p = |v: &[f64], q: f64| pct(&mut v.to_vec(), q);
    let lat = &lags.lag_ms;
    let (p50, p95, p99, max) = (p(lat, 0.5), p(lat, 0.95), p(lat, 0.99), p(lat, 1.0));
    let stmt = &lags.from_statement_ms;
    let (s50, s99, w50, w99) = (
        p(stmt, 0.5),
        p(stmt, 0.99),
        p(&lags.write_ms, 0.5),
        p(&lags.write_ms, 0.99),
    );
    let achieved = n as f64 / write_s;
    let turns_per_s = turns_done as f64 / (end - start).num_milliseconds() as f64 * 1000.0;
    let rebuilders = if echo_workers > 0 { 2 } else { 1 };
    println!("## Digest rebuilds under load ({sessions} sessions, {rate} fact writes/s target, {echo_workers} echo workers, {rebuilders} rebuilders)\n");
    println!("| writes | writes/s | rebuilds | coalesced writes | unreflected | p50 ms | p95 ms | p99 ms | max ms | echo turns (per s) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {n} | {achieved:.0} | {} | {} | {} | {p50:.2} | {p95:.2} | {p99:.2} | {max:.2} | {turns_done} ({turns_per_s:.0}) |\n",
        lags.rebuilds,
        lags.coalesced(n),
        lags.unreflected,
    );
    let hist = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, f64::INFINITY];
    let mut below = Vec::new();
    for h in hist {
        let share = lags.lag_ms.iter().filter(|&&l| l <= h).count() as f64 / n.max(1) as f64;
        below.push(
            json!({"le_ms": if h.is_finite() { json!(h) } else { json!("inf") }, "share": share}),
        );
    }
    println!(
        "lag ≤ 1 / 2 / 5 / 10 / 20 / 50 / 100 ms: {}",
        below
            .iter()
            .take(7)
            .map(|b| format!("{:.1} %", b["share"].as_f64().unwrap_or(0.0) * 100.0))
            .collect::<Vec<_>>()
            .join(" / ")
    );
    println!(
        "lag from the writing statement (adds the write's own commit): p50 {s50:.2} ms, p99 {s99:.2} ms; the write's commit took p50 {w50:.2} ms, p99 {w99:.2} ms"
    );
    let verdict = |v: f64| {
        if v <= DIGEST_LOAD_GOAL_MS {
            "met"
        } else {
            "missed"
        }
    };
    println!(
        "p99 / goal ({DIGEST_LOAD_GOAL_MS} ms) = {:.2} ({}) from the commit, {:.2} ({}) from the statement; {bursts} bursts of 5; seeding {sessions} digests took {seed_s:.1} s; {turns_left} turns still queued at the end\n",
        p99 / DIGEST_LOAD_GOAL_MS,
        verdict(p99),
        s99 / DIGEST_LOAD_GOAL_MS,
        verdict(s99),
    );
    Ok(
        json!({"suite": "digest-load", "sessions": sessions, "seconds": secs, "target_writes_per_s": rate,
        "writes": n, "writes_per_s": achieved, "bursts_of_5": bursts, "rebuilds": lags.rebuilds,
        "coalesced_writes": lags.coalesced(n), "unreflected": lags.unreflected,
        "redundant_rebuilds": lags.redundant,
        "lag_ms": {"p50": p50, "p95": p95, "p99": p99, "max": max, "cumulative": below},
        "lag_from_statement_ms": {"p50": s50, "p99": s99}, "write_commit_ms": {"p50": w50, "p99": w99},
        "goal_p99_ms": DIGEST_LOAD_GOAL_MS, "p99_over_goal": p99 / DIGEST_LOAD_GOAL_MS,
        "echo_workers": echo_workers, "echo_turns": turns_done, "echo_turns_per_s": turns_per_s, "turns_left": turns_left,
        "seed_s": seed_s}),
    )
}

/// Where each digest-load write's lag came from.
pub(super) struct LoadLags {
    /// Write's acknowledged commit → first digest reflecting it, for the writes some
    /// digest reflected. The acknowledgement comes a little after the commit, so this
    /// errs low by the writer's wake-up.
    lag_ms: Vec<f64>,
    /// The same from the writing statement: it errs high by the write's own commit (a WAL
    /// flush), which no rebuilder can shorten.
    from_statement_ms: Vec<f64>,
    /// Writing statement → acknowledged commit.
    write_ms: Vec<f64>,
    /// Digest versions that reflected at least one write no earlier digest had.
    rebuilds: usize,
    /// Digest versions of the bench's writes that reflected nothing new (a stale or
    /// duplicate rebuild).
    redundant: usize,
    /// Writes no stored digest ever reflected.
    unreflected: usize,
}

impl LoadLags {
    /// Writes that rode on another write's rebuild.
    fn coalesced(&self, writes: usize) -> usize {
        (writes - self.unreflected).saturating_sub(self.rebuilds)
    }
}

/// Matches each write to the first `digest_rebuilt` event (session, version, time) whose
/// version is that of the write or of a later write to its session: a session's writes
/// never overlap, so a later step's digest holds every earlier step's write.
pub(super) fn digest_load_lags(
    writes: &[FactWrite],
    events: &[(String, String, chrono::DateTime<chrono::Utc>)],
) -> LoadLags {
    let steps: std::collections::HashMap<String, u64> = writes
        .iter()
        .map(|w| (digest_load_version(w.session, w.step), w.step))
        .collect();
    let mut pending: BTreeMap<String, Vec<&FactWrite>> = BTreeMap::new();
    for w in writes {
        pending
            .entry(format!("dl{}", w.session))
            .or_default()
            .push(w);
    }
    for v in pending.values_mut() {
        v.sort_by_key(|w| std::cmp::Reverse(w.step));
    }
    let mut out = LoadLags {
        lag_ms: Vec::with_capacity(writes.len()),
        from_statement_ms: Vec::with_capacity(writes.len()),
        write_ms: Vec::with_capacity(writes.len()),
        rebuilds: 0,
        redundant: 0,
        unreflected: 0,
    };
    for (sid, version, at) in events {
        let (Some(&step), Some(open)) = (steps.get(version), pending.get_mut(sid)) else {
            continue;
        };
        let before = open.len();
        while open.last().is_some_and(|w| w.step <= step) {
            let w = open.pop().expect("checked");
            let ms = |from: chrono::DateTime<chrono::Utc>| {
                (*at - from).num_microseconds().unwrap_or(0) as f64 / 1000.0
            };
            out.lag_ms.push(ms(w.committed));
            out.from_statement_ms.push(ms(w.at));
            out.write_ms.push(ms(w.at) - ms(w.committed));
        }
        if open.len() < before {
            out.rebuilds += 1;
        } else {
            out.redundant += 1;
        }
    }
    out.unreflected = pending.values().map(Vec::len).sum();
    out
}

/// The open-loop writer: a tokio interval paces `total` writes at `rate` per second
/// whatever the database does (a closed loop would slow down with the system it
/// measures). A tenth of its picks write five times in a row to one session, using the
/// next four ticks. A session has one write in flight at most, so its writes commit in
/// step order. Returns the writes and the number of bursts.
pub(super) async fn digest_load_writer(
    pool: &PgPool,
    sessions: usize,
    rate: u64,
    total: u64,
) -> Result<(Vec<FactWrite>, usize)> {
    use rand::{Rng, SeedableRng};
    let busy = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    let (mut step, mut skip, mut bursts) = (0u64, 0u64, 0usize);
    while step < total {
        tick.tick().await;
        if skip > 0 {
            skip -= 1;
            continue;
        }
        let k = if rng.gen_bool(0.1) { 5 } else { 1 }.min(total - step);
        bursts += usize::from(k == 5);
        skip = k - 1;
        let session = loop {
            let s = rng.gen_range(0..sessions);
            if busy.lock().expect("not poisoned").insert(s) {
                break s;
            }
        };
        let (pool, busy, first) = (pool.clone(), busy.clone(), step + 1);
        step += k;
        tasks.spawn(async move {
            let mut done = Vec::with_capacity(k as usize);
            for step in first..first + k {
                let at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
                    "UPDATE facts SET value = $2, updated_at = clock_timestamp()
                      WHERE session_id = $1 AND type = 'quest' AND key = 'q' RETURNING updated_at",
                )
                .bind(format!("dl{session}"))
                .bind(format!("Quest step {step}"))
                .fetch_one(&pool)
                .await?;
                let committed = chrono::Utc::now();
                done.push(FactWrite {
                    session,
                    step,
                    at,
                    committed,
                });
            }
            busy.lock().expect("not poisoned").remove(&session);
            anyhow::Ok(done)
        });
    }
    let mut writes = Vec::with_capacity(total as usize);
    while let Some(done) = tasks.join_next().await {
        writes.extend(done??);
    }
    Ok((writes, bursts))
}
