//! The erased-scope sweep at scale: 20,000 erased scopes (KVMEM_BENCH_SWEEP_SCOPES), a
//! worker's first sweep (every scope new to it: one stat per scope, one listing of the
//! quarantine) against its next (the watermark: nothing new), beside a directory holding
//! snapshots of some of them written before the erase and one written after (a session id
//! used again), which must stay.

use super::*;

pub(super) async fn sweep(env: &Env) -> Result<Value> {
    let scopes: usize = std::env::var("KVMEM_BENCH_SWEEP_SCOPES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if env.quick { 2_000 } else { 20_000 });
    let (pool, _) = fresh_db(env, "kvmem_bench_sweep").await?;
    let dir = tempdir("sweep")?;
    let settings = Settings::defaults().with(json!({"kv_dir": dir, "log_level": "warn"}))?;
    let store = system::snapshot_store(&settings, &kvmem::metrics::Metrics::new())?;
    // Files of 200 of the scopes, written before their erase; one written after it.
    let names: Vec<String> = (0..scopes).map(|i| format!("{i:032x}")).collect();
    for name in names.iter().take(200) {
        std::fs::write(store.files().path(name), b"stale")?;
    }
    sqlx::query(
        "INSERT INTO erased_scopes (scope, erased_at)
         SELECT s, now() FROM unnest($1::text[]) s",
    )
    .bind(&names)
    .execute(&pool)
    .await?;
    let reused = &names[scopes - 1];
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::write(store.files().path(reused), b"new session")?;
    let keep = Duration::from_secs(7 * 24 * 3600);
    let mut mark = kvmem::erase::SweepMark::default();
    let mut rows = Vec::new();
    println!("## Erased-scope sweep ({scopes} erased scopes, 200 stale files, 1 reused)\n");
    println!("| pass | scopes swept | files removed | ms |");
    println!("|---|---:|---:|---:|");
    for pass in ["first", "second", "third"] {
        let t = Instant::now();
        let swept = kvmem::erase::sweep(&pool, &store, keep, &mut mark).await?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        println!(
            "| {pass} | {} | {} | {ms:.1} |",
            swept.scopes, swept.removed.files
        );
        rows.push(
            json!({"pass": pass, "scopes": swept.scopes, "files": swept.removed.files, "ms": ms}),
        );
    }
    anyhow::ensure!(
        store.files().path(reused).exists(),
        "the sweep removed a snapshot written after its scope's erase"
    );
    anyhow::ensure!(
        rows[0]["files"] == 200 && rows[1]["scopes"] == 0,
        "the first pass removes the 200 stale files, the next sweeps nothing: {rows:?}"
    );
    println!();
    pool.close().await;
    Ok(json!({"scopes": scopes, "passes": rows}))
}
