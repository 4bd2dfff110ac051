//! Bounded storage: the snapshot directory under its byte cap in local mode (an evicted
//! session's next turn rebuilds cold and replies as the warm one does), and row retention
//! (what a finished turn or job no longer needs goes, the dialogue stays).

use crate::common;

use common::*;
use kvmem::maintenance::sweep_storage;
use kvmem::runner::Deps;
use sqlx::PgPool;

const FIRST: &str = "Hello there, Ada, how are you today?";
const SECOND: &str = "Tell me more about the lighthouse.";

fn capped(dir: &std::path::Path, cap: u64) -> kvmem::config::Settings {
    settings(serde_json::json!({
        "kv_dir": dir, "n_ctx": 1024, "kv_tail_tokens": 512, "reply_max_tokens": 16,
        "kv_cache_bytes": cap,
    }))
}

fn bytes_in(dir: &std::path::Path) -> u64 {
    files_with_ext(dir, ".llkv")
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum()
}

async fn reply(pool: &PgPool, turn: kvmem::queue::TurnId) -> String {
    sqlx::query_scalar("SELECT reply FROM turns WHERE id = $1")
        .bind(turn.0)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn store(deps: &Deps) -> &kvmem::snapshot::SnapshotStore {
    deps.snapshots.as_ref().expect("a llama worker")
}

#[sqlx::test(migrations = false)]
async fn the_local_directory_stays_under_its_cap_and_an_evicted_session_rebuilds_as_warm(
    pool: PgPool,
) {
    migrate(&pool).await;
    // The control worker has no cap: its session stays warm.
    let control_dir = tempfile::tempdir().unwrap();
    let engine = load_engine(&tiny_model(), &capped(control_dir.path(), 0));
    let control = llama_deps(&pool, capped(control_dir.path(), 0), engine.clone(), "w0");
    let warm_ch = character(&pool, "uw", "Ada").await;
    one_turn(&control, "sw", "uw", warm_ch, FIRST).await;
    let one = bytes_in(control_dir.path());
    // Room for two snapshots of this size, not three.
    let cap = one * 5 / 2;
    let dir = tempfile::tempdir().unwrap();
    let w = llama_deps(&pool, capped(dir.path(), cap), engine.clone(), "w1");
    let evicted_ch = character(&pool, "ue", "Ada").await;
    one_turn(&w, "se", "ue", evicted_ch, FIRST).await;
    for i in 1..=3 {
        let user = format!("f{i}");
        let ch = character(&pool, &user, "Ada").await;
        one_turn(&w, &format!("s{i}"), &user, ch, FIRST).await;
        let held = bytes_in(dir.path());
        assert!(
            held <= cap,
            "after filler {i}: {held} bytes over a cap of {cap}"
        );
    }
    assert!(store(&w).counters().evictions.get() >= 2);
    let scope = kvmem::snapshot::scope_key("ue", evicted_ch, "se");
    assert!(!dir.path().join(format!("{scope}.llkv")).exists());

    let (warm, warm_log) = one_turn(&control, "sw", "uw", warm_ch, SECOND).await;
    let (cold, cold_log) = one_turn(&w, "se", "ue", evicted_ch, SECOND).await;
    assert!(!warm_log.cold, "{:?}", warm_log.cold_reason);
    assert!(cold_log.cold && cold_log.status == "OK", "{cold_log:?}");
    let rebuild: Option<String> =
        sqlx::query_scalar("SELECT rebuild FROM turn_log WHERE turn_id = $1 AND status = 'OK'")
            .bind(cold.0)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(rebuild.as_deref(), Some("exact"));
    assert_eq!(cold_log.tokens_in_kv, warm_log.tokens_in_kv);
    assert_eq!(reply(&pool, cold).await, reply(&pool, warm).await);

    // A restarted worker's index starts from the files on disk: under a smaller cap, the
    // oldest go at once.
    let restarted = llama_deps(&pool, capped(dir.path(), one * 3 / 2), engine, "w2");
    assert!(bytes_in(dir.path()) <= one * 3 / 2);
    assert_eq!(files_with_ext(dir.path(), ".llkv").len(), 1);
    assert!(store(&restarted).counters().evictions.get() >= 1);
}

/// Ages every finished row of the test's tables by `hours`.
async fn age(pool: &PgPool, hours: i32) {
    for table in ["turns", "turn_log", "memory_jobs", "summary_jobs"] {
        sqlx::query(&format!(
            "UPDATE {table} SET finished_at = finished_at - make_interval(hours => $1) \
             WHERE finished_at IS NOT NULL"
        ))
        .bind(hours)
        .execute(pool)
        .await
        .unwrap();
    }
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn retention_deletes_what_finished_turns_and_jobs_no_longer_need_and_keeps_the_dialogue(
    pool: PgPool,
) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let w = echo_deps(&pool, settings(serde_json::json!({})), "w1");
    for i in 0..3 {
        one_turn(&w, "s1", "u1", ch, &format!("message {i}")).await;
    }
    sqlx::query("UPDATE kvmem_config SET value = '1' WHERE key = 'max_attempts'")
        .execute(&pool)
        .await
        .unwrap();
    let dead = kvmem::queue::enqueue(&pool, "s2", "u1", ch, "echo-fail: boom", None)
        .await
        .unwrap();
    let ran = drain(&w).await;
    assert!(ran.contains(&kvmem::runner::Outcome::Dead(dead)), "{ran:?}");
    // The memory lane's jobs, as it leaves them: done and dropped.
    sqlx::query(
        "UPDATE memory_jobs SET state = CASE WHEN id % 2 = 0 THEN 'done' ELSE 'dropped' END, \
         finished_at = now()",
    )
    .execute(&pool)
    .await
    .unwrap();
    let jobs = count(&pool, "SELECT count(*) FROM memory_jobs").await;
    assert!(jobs >= 6, "{jobs} memory jobs");
    let messages = count(&pool, "SELECT count(*) FROM messages").await;
    let logs = count(&pool, "SELECT count(*) FROM turn_log").await;
    age(&pool, 30 * 24).await;
    // Rows of a minute ago stay: one more turn, and a job done just now.
    one_turn(&w, "s1", "u1", ch, "message 3").await;
    let fresh_job: i64 = sqlx::query_scalar(
        "UPDATE memory_jobs SET state = 'done', finished_at = now() \
         WHERE id = (SELECT max(id) FROM memory_jobs) RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    // 0 keeps everything.
    let off = echo_deps(
        &pool,
        settings(serde_json::json!({
            "finished_retention_hours": 0, "failed_retention_hours": 0, "log_retention_hours": 0,
        })),
        "w0",
    );
    let swept = sweep_storage(&off.housekeeping(), &mut 0).await;
    assert_eq!(swept.rows, kvmem::maintenance::Retained::default());

    let swept = sweep_storage(&w.housekeeping(), &mut 0).await;
    assert_eq!(swept.rows.turns, 1);
    assert_eq!(swept.rows.turn_log as i64, logs);
    assert_eq!(swept.rows.memory_jobs as i64, jobs);
    assert_eq!(swept.rows.summary_jobs, 0);
    assert_eq!(
        count(
            &pool,
            &format!("SELECT count(*) FROM turns WHERE id = {}", dead.0)
        )
        .await,
        0
    );
    // The dialogue and its turns stay, and the fresh rows.
    assert_eq!(
        count(&pool, "SELECT count(*) FROM turns WHERE state = 'done'").await,
        4
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM messages").await,
        messages + 2
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM turn_log").await, 1);
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM memory_jobs WHERE state <> 'queued'")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, [fresh_job]);
    let totals: Vec<(String, i64)> =
        sqlx::query_as("SELECT name, value FROM kvmem_storage_counts ORDER BY name")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        totals,
        [
            ("rows_removed.memory_jobs".to_string(), jobs),
            ("rows_removed.turn_log".to_string(), logs),
            ("rows_removed.turns".to_string(), 1),
        ]
    );
    let metrics = w.metrics.render(&pool).await.unwrap();
    assert!(
        metrics.contains("kvmem_retention_rows_removed_total{table=\"turns\"} 1"),
        "{metrics}"
    );
    // Nothing is left to remove.
    assert_eq!(
        sweep_storage(&w.housekeeping(), &mut 0).await.rows,
        kvmem::maintenance::Retained::default()
    );
    let nowhere = kvmem::system::snapshot_store(
        &settings(serde_json::json!({"kv_dir": "/nonexistent"})),
        &w.metrics,
    )
    .unwrap();
    let status = kvmem::cmd::status::storage(&pool, &nowhere).await.unwrap();
    assert!(status.contains("rows_removed.turns"), "{status}");
}

/// The samples of `kvmem_maintenance_runs_total`, by chore.
async fn chore_runs(deps: &Deps) -> std::collections::HashMap<String, f64> {
    let samples = counter_samples(deps, "kvmem_maintenance_runs_total").await;
    let by_chore = samples.into_iter().map(|(labels, n)| {
        let chore = labels.get("chore").unwrap_or_default().to_string();
        (chore, n)
    });
    by_chore.collect()
}

#[sqlx::test(migrations = false)]
async fn a_running_worker_runs_every_housekeeping_chore_on_its_own_tick(pool: PgPool) {
    migrate(&pool).await;
    // The reaper's tick is 200 ms in the tests' settings; the sweeps' is a minute.
    let deps = echo_deps(&pool, settings(serde_json::json!({})), "w-chores");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(kvmem::runner::run(deps.clone(), shutdown.clone()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let runs = loop {
        let runs = chore_runs(&deps).await;
        if runs.get("leases").copied().unwrap_or(0.0) >= 3.0 {
            break runs;
        }
        assert!(std::time::Instant::now() < deadline, "{runs:?}");
        tokio::task::yield_now().await;
    };
    shutdown.cancel();
    worker.await.unwrap().unwrap();
    for chore in ["leases", "trim", "erased", "storage"] {
        assert!(
            runs.get(chore).copied().unwrap_or(0.0) >= 1.0,
            "{chore}: {runs:?}"
        );
    }
    assert_eq!(
        runs["storage"], 1.0,
        "the storage sweep keeps its own tick: {runs:?}"
    );
    assert_eq!(runs["erased"], 1.0, "{runs:?}");
}
