//! The soak suite (issue 57): 2,000 sessions, one turn each, through the real pipeline and
//! real snapshot files, with the directory capped at a tenth of what they would take. The
//! directory is sampled after every turn and must never exceed the cap; evictions are
//! counted; and an evicted session's second turn runs cold and replies as a warm control
//! session does. The tiny model, not the echo generator: the echo generator writes no
//! snapshot, and the tiny model keeps 2,000 turns to minutes.

use super::*;

const FIRST: &str = "Hello there, how is the harbour this morning?";
const SECOND: &str = "Tell me more about the lighthouse.";

fn soak_settings(dir: &Path, cap: u64) -> Result<Settings> {
    Ok(Settings::defaults().with(json!({
        "kv_dir": dir, "n_ctx": 1024, "kv_tail_tokens": 512, "reply_max_tokens": 16,
        "kv_cache_bytes": cap, "memory_lane": false, "summary_lane": false, "log_level": "warn",
    }))?)
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".llkv"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// One turn of `user`'s session (one per user), run to completion; its id.
async fn turn(deps: &Deps, user: &str, ch: i64, msg: &str) -> Result<i64> {
    let sid = format!("s-{user}");
    let id = kvmem::queue::enqueue(&deps.pool, &sid, user, ch, msg, None).await?;
    let never = CancellationToken::new();
    loop {
        match runner::process_next_turn(deps, &never).await? {
            Outcome::Done(t) if t == id => return Ok(id.0),
            Outcome::Empty => anyhow::bail!("turn {id} not runnable"),
            other if other == Outcome::Failed(id) => anyhow::bail!("turn {id} failed"),
            _ => {}
        }
    }
}

async fn row(pool: &PgPool, id: i64) -> Result<(String, bool, Option<String>, i32)> {
    Ok(sqlx::query_as(
        "SELECT t.reply, l.cold, l.rebuild, l.tokens_in_kv FROM turns t
           JOIN turn_log l ON l.turn_id = t.id AND l.status = 'OK' WHERE t.id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await?)
}

pub(crate) async fn soak(env: &Env) -> Result<Value> {
    let tiny = std::env::var("KVMEM_BENCH_TINY").context("KVMEM_BENCH_TINY (ops/bench sets it)")?;
    let sessions: usize = if env.quick { 300 } else { 2000 };
    let (pool, _) = fresh_db(env, "kvmem_bench_soak").await?;
    let control_dir = tempfile::tempdir()?;
    let s = soak_settings(control_dir.path(), 0)?;
    let engine = Arc::new(kvmem::system::load_engine(
        Path::new(&tiny),
        None,
        EngineParams::from_settings(&s),
    )?);
    let control = llama_deps(&pool, s, engine.clone())?;
    let warm_ch = common::character(&pool, "control").await?;
    turn(&control, "control", warm_ch, FIRST).await?;
    let one = dir_bytes(control_dir.path());
    let cap = one * sessions as u64 / 10;
    let dir = tempfile::tempdir()?;
    let capped = llama_deps(&pool, soak_settings(dir.path(), cap)?, engine)?;
    let evictions = &capped
        .snapshots
        .as_ref()
        .context("a llama worker")?
        .counters()
        .evictions;
    let before = evictions.get();
    let started = Instant::now();
    let (mut max_held, mut written) = (0u64, 0u64);
    for i in 0..sessions {
        let user = format!("u{i}");
        let ch = common::character(&pool, &user).await?;
        turn(&capped, &user, ch, FIRST).await?;
        let held = dir_bytes(dir.path());
        anyhow::ensure!(
            held <= cap,
            "after session {i}: {held} bytes over a cap of {cap}"
        );
        max_held = max_held.max(held);
        written += one;
    }
    let seconds = started.elapsed().as_secs_f64();
    let evicted = evictions.get() - before;
    let first_ch: i64 =
        sqlx::query_scalar("SELECT character_id FROM turns WHERE user_id = 'u0' LIMIT 1")
            .fetch_one(&pool)
            .await?;
    let scope = snapshot::scope_key("u0", first_ch, "s-u0");
    anyhow::ensure!(
        !dir.path().join(format!("{scope}.llkv")).exists(),
        "session 0 was not evicted"
    );
    let warm = row(&pool, turn(&control, "control", warm_ch, SECOND).await?).await?;
    let cold = row(&pool, turn(&capped, "u0", first_ch, SECOND).await?).await?;
    let same = warm.0 == cold.0 && warm.3 == cold.3;
    println!("## soak\n");
    println!("| sessions | one snapshot | cap | max held | evictions | files left | s | evicted session's 2nd turn |");
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {sessions} | {one} B | {cap} B | {max_held} B | {evicted} | {} | {seconds:.0} | cold={} rebuild={:?}, reply and KV tokens same as warm: {same} |\n",
        std::fs::read_dir(dir.path())?.count(),
        cold.1,
        cold.2
    );
    anyhow::ensure!(!warm.1 && cold.1 && same, "warm {warm:?} cold {cold:?}");
    Ok(json!({
        "sessions": sessions, "snapshot_bytes": one, "written_bytes_estimate": written, "cap": cap,
        "max_dir_bytes": max_held, "evictions": evicted, "seconds": seconds,
        "second_turn": { "cold": cold.1, "rebuild": cold.2, "reply_same_as_warm": warm.0 == cold.0,
                          "tokens_same_as_warm": warm.3 == cold.3 },
    }))
}
