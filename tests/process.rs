//! The `kvmem` binary as ops run it: a worker process that is killed and restarted resumes
//! the scene warm, and the CLI reports bad input clearly.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use sqlx::PgPool;

fn worker(url: &str, kv_dir: &std::path::Path) -> Child {
    kvmem_command(url)
        .args(["worker", "--generator", "llama"])
        .env("KVMEM_MODEL_PATH", tiny_model())
        .env("KVMEM_KV_DIR", kv_dir)
        .env("N_CTX", "1024")
        .env("KV_TAIL_TOKENS", "256")
        .env("REPLY_MAX_TOKENS", "16")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start kvmem worker")
}

async fn wait_state(pool: &PgPool, id: i64, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state: String = sqlx::query_scalar("SELECT state::text FROM turns WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
        if state == want {
            return;
        }
        assert!(Instant::now() < deadline, "turn {id} stuck in {state}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn a_killed_worker_restarts_and_the_next_turn_is_warm(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let url = db_url(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let mut w = worker(&url, dir.path());
    for msg in ["first", "second"] {
        let id = kvmem::queue::enqueue(&pool, "s", "u1", ch, msg, None)
            .await
            .unwrap();
        wait_state(&pool, id.0, "done").await;
    }
    // Stop the process the hard way, mid-scene.
    w.kill().unwrap();
    w.wait().unwrap();
    let mut w = worker(&url, dir.path());
    let id = kvmem::queue::enqueue(&pool, "s", "u1", ch, "third", None)
        .await
        .unwrap();
    wait_state(&pool, id.0, "done").await;
    let log = last_log(&pool, id.0).await;
    assert!(log.loaded && !log.cold, "{log:?}");
    // SIGTERM is a graceful stop: the process exits by itself.
    let pid = w.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = w.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "worker ignored SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn a_wrong_model_file_stops_the_worker_with_a_clear_error(pool: PgPool) {
    migrate(&pool).await;
    let url = db_url(&pool).await;
    let out = Command::new(env!("CARGO_BIN_EXE_kvmem"))
        .args(["worker"])
        .env("DATABASE_URL", &url)
        .env("KVMEM_MODEL_PATH", tiny_model())
        .env("MODEL_SHA", "ab".repeat(32))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MODEL_SHA pins"), "{err}");
}

#[sqlx::test(migrations = false)]
async fn cli_enqueue_reports_bad_input(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let url = db_url(&pool).await;
    let run = |msg: &str, character: i64| {
        Command::new(env!("CARGO_BIN_EXE_kvmem"))
            .args([
                "enqueue",
                "--session",
                "s",
                "--user",
                "u1",
                "--character",
                &character.to_string(),
                "--message",
                msg,
            ])
            .env("DATABASE_URL", &url)
            .output()
            .unwrap()
    };
    let ok = run("hello", ch);
    assert_success(&ok);
    let bad = run("   ", ch);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("message must not be empty"));
    let bad = run("hi", ch + 100);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown character"));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
}
