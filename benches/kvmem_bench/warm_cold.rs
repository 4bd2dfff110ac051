//! The warm-resume suites: cold against warm time to first token, and the snapshot's I/O phases.

use super::*;

/// What `--quick` (CI's smoke run) asks of warm against cold, in tokens, not times: a warm
/// turn prefills only its new exchange, a cold one the whole history, so the cold turns'
/// fewest prefilled tokens must be at least this many times the warm turns' most. Counts
/// do not move with a loaded machine (a CI run on a busy machine measured cold ÷ warm TTFT
/// 10.8× while prefilling 760 tokens cold against 12 warm); a warm path that re-prefills
/// or runs cold fails it. The times stay in the report.
pub(super) const QUICK_PREFILL_FLOOR: f64 = 10.0;

/// The goals the speed work set: cold ÷ warm TTFT at about 1,000 and 2,000 tokens.
pub(super) const RATIO_GOALS: [(usize, f64); 2] = [(1000, 50.0), (2000, 100.0)];

/// The warm-cold suite once per KV cache type (`KVMEM_BENCH_KV_TYPES`, default `f16,q8_0`:
/// the default and the one batching needs), and at the history sizes of
/// `KVMEM_BENCH_SIZES` (default 500, 1,000 and 2,000; 500 with `--quick`).
pub(super) async fn warm_cold(env: &Env, model: &Path) -> Result<Value> {
    let list = |var: &str, default: &str| -> Vec<String> {
        std::env::var(var)
            .unwrap_or_else(|_| default.to_string())
            .split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect()
    };
    let default_sizes = if env.quick { "500" } else { "500,1000,2000" };
    let sizes = list("KVMEM_BENCH_SIZES", default_sizes)
        .iter()
        .map(|x| {
            x.parse::<usize>()
                .context("KVMEM_BENCH_SIZES: token counts")
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::new();
    for kv_type in list("KVMEM_BENCH_KV_TYPES", "f16,q8_0") {
        out.push(warm_cold_kv(env, model, &kv_type, &sizes).await?);
    }
    Ok(json!({"suite": "warm-cold", "model": model, "kv_types": out}))
}

pub(super) async fn warm_cold_kv(
    env: &Env,
    model: &Path,
    kv_type: &str,
    sizes: &[usize],
) -> Result<Value> {
    let (warm_n, cold_n) = if env.quick { (3, 2) } else { (5, 3) };
    let kv_dir = tempdir(&format!("warm-cold-{kv_type}"))?;
    let base = Settings::defaults().with(json!({
        "kv_dir": kv_dir, "n_ctx": 4096, "kv_tail_tokens": 3000, "reply_max_tokens": 32, "log_level": "warn",
        "kv_type": kv_type,
    }))?;
    let engine = Arc::new(kvmem::system::load_engine(
        model,
        None,
        EngineParams::from_settings(&base),
    )?);
    let store = kvmem::system::snapshot_files(&kv_dir, Limits::LOOSE);
    let mut rows = Vec::new();
    let mut shares = Vec::new();
    let mut ratios = Vec::new();
    let mut prefills = Vec::new();
    let name = model.file_name().unwrap_or_default().to_string_lossy();
    println!("## Warm vs cold ({name}, {kv_type} KV, reply ≤ 32 tokens)\n");
    println!("Cold re-prefills the whole dialogue: `cold (lost snapshot)` decodes the recorded KV dialogue, `rollback` rebuilds it from the text. Medians, [min–max] over n turns.\n");
    println!("| history tokens | mode | ttft ms | cold ÷ this (ttft) | turn ms | prefill tokens | prefill ms | n |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for &size in sizes {
        // A database per size and KV type: every size is one user's only history, so recall (on, as
        // by default) never finds the same filler in another size's session.
        let (pool, _) = fresh_db(env, &format!("kvmem_bench_warm_cold_{kv_type}_{size}")).await?;
        let ch = character(&pool).await?;
        let warm_deps = llama_deps(&pool, base.clone(), engine.clone())?;
        let rollback_deps = llama_deps(
            &pool,
            base.with(json!({"kv_only_enabled": false}))?,
            engine.clone(),
        )?;
        let sid = format!("wc{size}");
        let history = seed_history(&pool, &engine, &sid, ch, size).await?;
        // The lane embeds the seeded dialogue, as it would have while those turns ran;
        // else recall would embed its candidates on the turn's own path.
        let lane = kvmem::system::memory_lane_service(pool.clone(), &base, None, None).await?;
        kvmem::memory::ingest::jobs::drain(&lane).await?;
        let scope = snapshot::scope_key("bench", ch, &sid);
        let mut modes: BTreeMap<&str, Vec<TurnTimes>> = BTreeMap::new();
        for i in 0..cold_n {
            let t = timed_turn(
                &rollback_deps,
                &lane,
                &sid,
                ch,
                &format!("Rollback question {i}?"),
            )
            .await?;
            anyhow::ensure!(t.cold, "a rollback turn ran warm");
            modes.entry("rollback").or_default().push(t);
        }
        // The first kv_only turn finds no snapshot (rollback turns write none): it is cold.
        let t = timed_turn(&warm_deps, &lane, &sid, ch, "Status report?").await?;
        anyhow::ensure!(t.cold, "the first kv_only turn found a snapshot");
        modes.entry("cold (lost snapshot)").or_default().push(t);
        for i in 0..warm_n {
            let t = timed_turn(&warm_deps, &lane, &sid, ch, &format!("Warm question {i}?")).await?;
            anyhow::ensure!(
                !t.cold && t.tokens_loaded as usize >= history,
                "a warm turn ran cold or lost history"
            );
            modes.entry("warm (snapshot)").or_default().push(t);
        }
        for i in 1..cold_n {
            store.remove(&scope)?;
            let t = timed_turn(&warm_deps, &lane, &sid, ch, &format!("After loss {i}?")).await?;
            anyhow::ensure!(t.cold, "a turn after the snapshot's loss ran warm");
            modes.entry("cold (lost snapshot)").or_default().push(t);
        }
        let col = |v: &[TurnTimes], f: fn(&TurnTimes) -> i32| -> Vec<f64> {
            v.iter().map(|t| f(t) as f64).collect()
        };
        let warm = &modes["warm (snapshot)"];
        let warm_ttft = median(&mut col(warm, |t| t.ttft_ms));
        let cold_ttft = median(&mut col(&modes["cold (lost snapshot)"], |t| t.ttft_ms));
        let rollback_ttft = median(&mut col(&modes["rollback"], |t| t.ttft_ms));
        for (mode, v) in &modes {
            let (ttft, turn, ptok, pms) = (
                col(v, |t| t.ttft_ms),
                col(v, |t| t.latency_ms),
                col(v, |t| t.prefill_tokens),
                col(v, |t| t.prefill_ms),
            );
            let mt = median(&mut ttft.clone());
            println!(
                "| {history} | {mode} | {} | {:.1}× | {} | {:.0} | {:.0} | {} |",
                spread(&ttft),
                cold_ttft / mt,
                spread(&turn),
                median(&mut ptok.clone()),
                median(&mut pms.clone()),
                v.len()
            );
            rows.push(
                json!({"history_tokens": history, "mode": mode, "ttft_ms": stats(&ttft),
                "turn_ms": stats(&turn), "prefill_tokens": stats(&ptok), "prefill_ms": stats(&pms),
                "cold_over_this_ttft": cold_ttft / mt}),
            );
        }
        // Where a warm turn's time goes. TTFT is what the turn spent before its engine
        // thread (inputs, recall, the snapshot read), the restore, the prefill and the
        // first token's sampling.
        let part = |f: fn(&TurnTimes) -> i32| median(&mut col(warm, f));
        let (turn, ttft, load, prefill) = (
            part(|t| t.latency_ms),
            part(|t| t.ttft_ms),
            part(|t| t.load_ms),
            part(|t| t.prefill_ms),
        );
        let before = (ttft - load - prefill).max(0.0);
        let (gen, redecode, save) = (
            part(|t| t.generate_ms),
            part(|t| t.redecode_ms),
            part(|t| t.save_ms),
        );
        shares.push((history, turn, before, load, prefill, gen, redecode, save));
        ratios.push((history, cold_ttft / warm_ttft, rollback_ttft / warm_ttft));
        let most = |v: &[TurnTimes]| v.iter().map(|t| t.prefill_tokens).max().unwrap_or(0);
        let fewest = |v: &[TurnTimes]| v.iter().map(|t| t.prefill_tokens).min().unwrap_or(0);
        prefills.push((history, most(warm), fewest(&modes["cold (lost snapshot)"])));
        rows.push(
            json!({"history_tokens": history, "mode": "warm share", "turn_ms": turn,
            "before_engine_ms": before, "load_ms": load, "prefill_ms": prefill,
            "generate_ms": gen, "redecode_ms": redecode, "save_ms": save}),
        );
        pool.close().await;
    }
    println!("\nA warm turn's time (medians; `inputs + read` is the turn's work before its engine thread: HUD, digest, recall, the snapshot file):\n");
    println!("| history tokens | turn ms | inputs + read | restore | prefill | generate | re-decode | save |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (h, turn, before, load, prefill, gen, redecode, save) in &shares {
        let pc = |x: f64| format!("{x:.0} ({:.0}%)", 100.0 * x / turn);
        println!(
            "| {h} | {turn:.0} | {} | {} | {} | {} | {} | {} |",
            pc(*before),
            pc(*load),
            pc(*prefill),
            pc(*gen),
            pc(*redecode),
            pc(*save)
        );
    }
    println!();
    for (h, cold, rollback) in &ratios {
        let goal = RATIO_GOALS
            .iter()
            .find(|(size, _)| h.abs_diff(*size) * 10 <= *size)
            .map_or(String::new(), |(_, g)| {
                format!(
                    " (goal ≥ {g:.0}×: {})",
                    if cold >= g { "met" } else { "NOT met" }
                )
            });
        println!("- {h} tokens, {kv_type} KV: cold ÷ warm TTFT {cold:.1}×{goal}; rollback ÷ warm {rollback:.1}×");
    }
    println!();
    if env.quick {
        let (h, warm_most, cold_fewest) = prefills[0];
        println!("- {h} tokens, {kv_type} KV: prefilled tokens, warm at most {warm_most}, cold at least {cold_fewest}");
        anyhow::ensure!(
            f64::from(cold_fewest) >= QUICK_PREFILL_FLOOR * f64::from(warm_most.max(1)),
            "warm-cold regression at {h} tokens ({kv_type} KV): a warm turn prefilled {warm_most} tokens against a cold one's {cold_fewest}, under the floor of {QUICK_PREFILL_FLOOR}×"
        );
    }
    let ratios: Vec<Value> = ratios
        .iter()
        .map(|(h, c, r)| json!({"history_tokens": h, "cold_over_warm_ttft": c, "rollback_over_warm_ttft": r}))
        .collect();
    Ok(json!({"kv_type": kv_type, "rows": rows, "ratios": ratios}))
}

pub(super) fn snapshot_io(env: &Env) -> Result<Value> {
    let reps = if env.quick { 2 } else { 5 };
    let dir = tempdir("snapshot-io")?;
    let mut rows = Vec::new();
    println!("## Snapshot I/O at 2000 tokens (SmolLM2, median of {reps}, ms)\n");
    println!("| KV type | zstd | raw bytes | stored bytes | ratio | bpt | get-state | compress | crc | write+fsync+rename | read | crc | decompress | restore | save total | load total | memcpy |");
    println!(
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for kv in ["f16", "q8_0"] {
        let s = Settings::defaults().with(json!({"n_ctx": 4096, "kv_type": kv}))?;
        let engine =
            kvmem::system::load_engine(&env.smollm2, None, EngineParams::from_settings(&s))?;
        let mut ctx = engine.new_context()?;
        let mut session = KvSession::empty(&engine, &mut ctx);
        session.append(
            &engine.base_tokens("You are Captain Vega."),
            Some(SegKind::Base),
        )?;
        let mut i = 0;
        while session.len() < 2000 {
            let (u, a) = filler(i);
            let t = engine.block(&engine.frame.exchange, &[&u, &a]);
            let room = 2000 - session.len() as usize;
            session.append(&t[..t.len().min(room)], Some(SegKind::Turn))?;
            i += 1;
        }
        let ids = session.token_ids();
        let segs = session.segments().to_vec();
        for compress in [true, false] {
            let mut p: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
            let (mut raw, mut stored) = (0, 0);
            for _ in 0..reps {
                let t = Instant::now();
                let state = session.export_state();
                p.entry("get").or_default().push(ms(t.elapsed()));
                let t = Instant::now();
                let payload = if compress {
                    zstd::bulk::compress(&state, 1)?
                } else {
                    state.clone()
                };
                p.entry("compress")
                    .or_default()
                    .push(if compress { ms(t.elapsed()) } else { 0.0 });
                let t = Instant::now();
                let crc = crc32c::crc32c(&payload);
                p.entry("crc").or_default().push(ms(t.elapsed()));
                let mut h = header(kv, compress);
                h.segments = segs.clone();
                let file = snapshot::encode(&mut h, &ids, &state)?;
                let store = kvmem::system::snapshot_files(&dir, Limits::LOOSE);
                let t = Instant::now();
                store.save("io", &file)?;
                p.entry("write").or_default().push(ms(t.elapsed()));
                let t = Instant::now();
                let bytes = std::fs::read(store.path("io"))?;
                p.entry("read").or_default().push(ms(t.elapsed()));
                let t = Instant::now();
                let again = crc32c::crc32c(&payload);
                assert_eq!(again, crc);
                p.entry("crc_load").or_default().push(ms(t.elapsed()));
                let t = Instant::now();
                let restored = if compress {
                    zstd::bulk::decompress(&payload, state.len())?
                } else {
                    payload.clone()
                };
                p.entry("decompress").or_default().push(if compress {
                    ms(t.elapsed())
                } else {
                    0.0
                });
                let mut ctx2 = engine.new_context()?;
                let t = Instant::now();
                KvSession::restore(&engine, &mut ctx2, &restored, &ids, &segs)?;
                p.entry("restore").or_default().push(ms(t.elapsed()));
                let t = Instant::now();
                let copy = state.clone();
                p.entry("memcpy").or_default().push(ms(t.elapsed()));
                std::hint::black_box(&copy);
                raw = state.len();
                stored = payload.len();
                drop(bytes);
            }
            let m = |k: &str| median(&mut p[k].clone());
            let save = m("get") + m("compress") + m("crc") + m("write");
            let load = m("read") + m("crc_load") + m("decompress") + m("restore");
            println!(
                "| {kv} | {} | {raw} | {stored} | {:.3} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {save:.1} | {load:.1} | {:.1} |",
                if compress { "on" } else { "off" },
                stored as f64 / raw as f64,
                raw / ids.len(),
                m("get"), m("compress"), m("crc"), m("write"), m("read"), m("crc_load"), m("decompress"), m("restore"), m("memcpy")
            );
            let phases: BTreeMap<&str, Value> = p.iter().map(|(k, v)| (*k, stats(v))).collect();
            rows.push(json!({"kv_type": kv, "compress": compress, "raw_bytes": raw, "stored_bytes": stored,
                "ratio": stored as f64 / raw as f64, "bpt": raw / ids.len(), "tokens": ids.len(), "phases_ms": phases,
                "save_total_ms": save, "load_total_ms": load}));
        }
    }
    println!();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({"suite": "snapshot-io", "rows": rows}))
}
