//! A worker stalled past its lease (SIGSTOP, as a VM pause or a long stall would) must
//! never make a later turn trust its work. Each test stops a real `kvmem worker` process at
//! an exact step of a turn (the `KVMEM_TEST_STOP_AT` hook: the process stops itself there),
//! lets a second worker take the turn over and commit it, then continues the first one.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use kvmem::snapshot::{self, Limits};
use sqlx::PgPool;

const SID: &str = "stall_1";
const USER: &str = "u_stall";

/// A `kvmem worker` on the tiny model, its stderr kept in a file for the assertions.
fn worker(url: &str, kv: &Path, stop_at: Option<&str>, log: &Path) -> Child {
    let mut cmd = kvmem_command(url);
    cmd.arg("worker")
        .env("KVMEM_MODEL_PATH", tiny_model())
        .env("KVMEM_KV_DIR", kv)
        .env("REPLY_MAX_TOKENS", "24")
        .env("KV_TAIL_TOKENS", "512")
        .env("KVMEM_LOG_LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    if let Some(point) = stop_at {
        cmd.env("KVMEM_TEST_STOP_AT", point);
    }
    cmd.spawn().expect("spawn kvmem worker")
}

/// The process state letter from /proc (`T` = stopped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces; the state follows it.
    stat.rsplit_once(") ")?.1.chars().next()
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill() on our own child's pid with a valid signal number.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0, "kill({}, {sig})", child.id());
}

/// Polls until `ready` holds, failing the test with `what` after `limit`.
async fn until<F, Fut>(what: &str, limit: Duration, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !ready().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_stopped(child: &mut Child, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "worker exited ({status}) before its stop point:\n{}",
                read(log)
            );
        }
        if proc_state(child.id()) == Some('T') {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "worker never reached its stop point"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn terminate(mut child: Child) {
    signal(&child, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "worker did not stop on SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn read(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

fn snapshot_path(kv: &Path, ch: i64) -> PathBuf {
    kv.join(format!("{}.llkv", snapshot::scope_key(USER, ch, SID)))
}

/// The fence in the session's snapshot header, if there is a readable one.
fn file_fence(kv: &Path, ch: i64) -> Option<i64> {
    let bytes = std::fs::read(snapshot_path(kv, ch)).ok()?;
    snapshot::parse_header(&bytes, Limits::LOOSE)
        .ok()
        .map(|(h, _)| h.fence)
}

async fn turn_state(pool: &PgPool, id: i64) -> String {
    sqlx::query_scalar("SELECT state::text FROM turns WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Runs turn 1 with worker A stopped at `stop_at` and worker B taking over; returns the
/// ids, A's fencing token and B's committed token. A is continued and has finished its
/// attempt (its log shows `settled`) before this returns.
struct Stall {
    ch: i64,
    turn: i64,
    token_a: i64,
    done_token: i64,
    log_a: String,
}

async fn stall(pool: &PgPool, kv: &Path, logs: &Path, stop_at: &str, settled: &str) -> Stall {
    migrate(pool).await;
    let ch = character(pool, USER, "Nova").await;
    let url = db_url(pool).await;
    let (log_a, log_b) = (logs.join("a.log"), logs.join("b.log"));

    let mut a = worker(&url, kv, Some(stop_at), &log_a);
    let turn = kvmem::queue::enqueue(pool, SID, USER, ch, "Scan the hangar.", None)
        .await
        .unwrap()
        .0;
    wait_stopped(&mut a, &log_a).await;
    let (state, token_a): (String, i64) = sqlx::query_as(
        "SELECT t.state::text, l.fencing_token FROM turns t JOIN session_locks l ON l.turn_id = t.id WHERE t.id = $1",
    )
    .bind(turn)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(state, "running", "A stopped while holding the turn");

    // B takes over once A's lease expires (a real-time wait: lease expiry).
    let b = worker(&url, kv, None, &log_b);
    until("B to commit the turn", Duration::from_secs(120), || async {
        turn_state(pool, turn).await == "done"
    })
    .await;
    terminate(b).await;
    let done_token: i64 = sqlx::query_scalar("SELECT done_token FROM turns WHERE id = $1")
        .bind(turn)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_ne!(done_token, token_a, "the takeover ran under a new token");
    assert_eq!(
        file_fence(kv, ch),
        Some(done_token),
        "B's snapshot is in place"
    );

    signal(&a, libc::SIGCONT);
    until(
        "A to finish its attempt",
        Duration::from_secs(60),
        || async { read(&log_a).contains(settled) },
    )
    .await;
    terminate(a).await;
    Stall {
        ch,
        turn,
        token_a,
        done_token,
        log_a: read(&log_a),
    }
}

/// The turn committed once: one OK log row, its two messages, the reply they carry.
async fn assert_committed_once(pool: &PgPool, turn: i64) {
    let (ok_rows, user_rows, reply_matches): (i64, i64, bool) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM turn_log WHERE turn_id = $1 AND status = 'OK'),
                (SELECT count(*) FROM messages WHERE turn_id = $1),
                (SELECT m.content = t.reply FROM messages m JOIN turns t ON t.id = m.turn_id
                  WHERE m.turn_id = $1 AND m.role = 'assistant')",
    )
    .bind(turn)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(ok_rows, 1, "exactly one OK turn_log row");
    assert_eq!(user_rows, 2, "one user and one assistant message");
    assert!(reply_matches, "the stored reply is the committed attempt's");
}

#[sqlx::test(migrations = false)]
async fn a_worker_paused_before_its_rename_cannot_make_the_next_turn_trust_its_snapshot(
    pool: PgPool,
) {
    let kv = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let s = stall(
        &pool,
        kv.path(),
        logs.path(),
        "before_rename",
        "completion rejected: lease lost",
    )
    .await;

    // The stale rename happened: A's file, with A's token, now sits where B's was.
    assert_eq!(
        file_fence(kv.path(), s.ch),
        Some(s.token_a),
        "A renamed its snapshot over B's after continuing; log:\n{}",
        s.log_a
    );
    assert_committed_once(&pool, s.turn).await;

    // The next turn must not resume A's KV: same turn id, wrong token.
    let settings = settings(
        serde_json::json!({ "kv_dir": kv.path(), "kv_tail_tokens": 512, "reply_max_tokens": 24 }),
    );
    let engine = load_engine(&tiny_model(), &settings);
    let deps = llama_deps(&pool, settings, engine, "w-next");
    let (_, log) = one_turn(&deps, SID, USER, s.ch, "Anything else?").await;
    assert_eq!(log.status, "OK", "{log:?}");
    assert!(log.cold && !log.loaded, "{log:?}");
    let reason = log.cold_reason.unwrap_or_default();
    assert!(
        reason.starts_with("stale") && reason.contains(&format!("fence {}", s.token_a)),
        "cold because A's snapshot is stale: {reason}"
    );
    let _ = s.done_token;
}

#[sqlx::test(migrations = false)]
async fn a_worker_paused_before_its_save_leaves_the_committed_snapshot_alone(pool: PgPool) {
    let kv = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let s = stall(
        &pool,
        kv.path(),
        logs.path(),
        "before_save",
        "the session's snapshot is left alone",
    )
    .await;

    assert!(
        s.log_a
            .contains("lease lost before the snapshot save; the session's snapshot is left alone"),
        "A checked its lease before writing; log:\n{}",
        s.log_a
    );
    assert_eq!(
        file_fence(kv.path(), s.ch),
        Some(s.done_token),
        "B's snapshot is still the one in place"
    );
    assert_committed_once(&pool, s.turn).await;

    // The next turn resumes warm, from B's snapshot.
    let settings = settings(
        serde_json::json!({ "kv_dir": kv.path(), "kv_tail_tokens": 512, "reply_max_tokens": 24 }),
    );
    let engine = load_engine(&tiny_model(), &settings);
    let deps = llama_deps(&pool, settings, engine, "w-next");
    let (_, log) = one_turn(&deps, SID, USER, s.ch, "Anything else?").await;
    assert_eq!(log.status, "OK", "{log:?}");
    assert!(
        log.loaded && !log.cold,
        "warm from the committed snapshot: {log:?}"
    );
}
