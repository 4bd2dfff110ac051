//! A worker stalled past its lease (SIGSTOP, as a VM pause or a long stall would) must
//! never make a later turn trust its work. Each test stops a real `kvmem worker` process at
//! an exact step of a turn (the `KVMEM_TEST_STOP_AT` hook: the process stops itself there),
//! lets a second worker take the turn over and commit it, then continues the first one.
//! And a worker killed mid-stream: the re-run's stream says so, and no reader stitches
//! two attempts together.

use crate::common;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kvmem::snapshot::{self, Limits};
use serde_json::{json, Value};
use sqlx::PgPool;

const SID: &str = "stall_1";
const USER: &str = "u_stall";

/// A `kvmem worker` on the tiny model, its stderr kept in a file for the assertions.
fn worker(url: &str, kv: &Path, stop_at: Option<&str>, log: &Path) -> Child {
    worker_command(url, kv, stop_at, log)
        .spawn()
        .expect("spawn kvmem worker")
}

/// [`worker`] before it starts, for a test that sets more of its environment.
pub(crate) fn worker_command(url: &str, kv: &Path, stop_at: Option<&str>, log: &Path) -> Command {
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
    cmd
}

/// The process state letter from /proc (`T` = stopped).
pub(crate) fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces; the state follows it.
    stat.rsplit_once(") ")?.1.chars().next()
}

pub(crate) fn signal(child: &Child, sig: i32) {
    // SAFETY: kill() on our own child's pid with a valid signal number.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0, "kill({}, {sig})", child.id());
}

/// Polls until `ready` holds, failing the test with `what` after `limit`.
pub(crate) async fn until<F, Fut>(what: &str, limit: Duration, mut ready: F)
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

pub(crate) async fn wait_stopped(child: &mut Child, log: &Path) {
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

pub(crate) async fn terminate(mut child: Child) {
    signal(&child, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "worker did not stop on SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn read(path: &Path) -> String {
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

/// A worker that stops itself right after publishing the first text of a reply, and is
/// killed there (SIGKILL), while a client streams the turn over HTTP and a backend LISTENs
/// on the session. Another worker runs the turn again: its stream opens with a reset and a
/// larger attempt, its deltas joined are the stored reply, and the HTTP client, which
/// already showed part of the first attempt, gets a clear SSE error instead of a stitched
/// reply. A second request for the same turn (its idempotency key) streams it whole.
#[sqlx::test(migrations = false)]
async fn a_worker_killed_mid_stream_leaves_a_whole_reply_and_a_clear_error(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let url = db_url(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    // SmolLM2 (the reply is text to compare), a short lease so the re-run comes soon.
    let spawn = |stop: bool| {
        let stop_at = stop.then_some("mid_stream");
        let log = logs.path().join(format!("worker-{stop}.log"));
        let mut cmd = worker_command(&url, dir.path(), stop_at, &log);
        cmd.env("KVMEM_MODEL_PATH", smollm2())
            .env("N_CTX", "1024")
            .env("KV_TAIL_TOKENS", "900")
            .env("REPLY_MAX_TOKENS", "32")
            .env("KVMEM_LEASE_MS", "1500")
            .env("KVMEM_HEARTBEAT_MS", "300");
        cmd.spawn().expect("spawn kvmem worker")
    };
    let mut doomed = spawn(true);
    let state =
        crate::common::http_state(pool.clone(), Arc::new(settings(json!({}))), "ab".repeat(32));
    let api = serve(state, None).await;
    let chat_url = format!("{}/v1/chat/completions", api.base);
    let mut tap = StreamTap::session(&pool, "s-kill").await;
    let request = json!({"session_id": "s-kill", "user": "u1", "character_id": ch, "stream": true,
                         "messages": [{"role": "user", "content": "Describe the outpost we found."}]});
    let client = reqwest::Client::new();
    let sent = client
        .post(&chat_url)
        .header("Idempotency-Key", "k1")
        .json(&request)
        .send();
    let mut body = sent.await.unwrap();
    assert_eq!(body.status(), 200);
    let mut seen = String::new();
    // The first content chunk: the worker has published text and stopped itself.
    while sse_content(&sse_chunks(&sse_events(&seen))).is_empty() {
        let bytes = body
            .chunk()
            .await
            .unwrap()
            .expect("SSE until the first content");
        seen.push_str(std::str::from_utf8(&bytes).unwrap());
    }
    // It stops itself right after that publish; the client may hear it a moment first.
    wait_stopped(&mut doomed, &logs.path().join("worker-true.log")).await;
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    let rescuer = spawn(false);
    while let Some(bytes) = body.chunk().await.unwrap() {
        seen.push_str(std::str::from_utf8(&bytes).unwrap());
    }
    let events = sse_events(&seen);
    let (last_event, last_data) = events.last().unwrap().clone();
    assert_eq!(last_event.as_deref(), Some("error"), "{seen}");
    let error: Value = serde_json::from_str(&last_data).unwrap();
    assert_eq!(error["error"]["code"], "turn_restarted", "{seen}");
    assert!(!seen.contains("[DONE]"), "{seen}");
    let id = error["error"]["turn_id"].as_i64().unwrap();

    let (deltas, state) = tap.until_end(id).await;
    assert_eq!(state, "done");
    let (reply, token) = stored_reply(&pool, id).await;
    let attempts: BTreeSet<i64> = deltas.iter().map(|d| d.attempt).collect();
    assert_eq!(
        attempts.len(),
        2,
        "the killed attempt and the re-run: {deltas:?}"
    );
    let (first, second) = (*attempts.first().unwrap(), *attempts.last().unwrap());
    assert_eq!(second, token, "the re-run committed");
    let retry: Vec<_> = deltas.iter().filter(|d| d.attempt == second).collect();
    assert!(
        retry[0].reset && retry[0].seq == 0,
        "the re-run opens with a reset"
    );
    assert_eq!(
        joined_attempt(&deltas, second),
        reply,
        "the stored reply is the re-run's, whole"
    );
    let shown = sse_content(&sse_chunks(&events));
    let killed: String = deltas
        .iter()
        .filter(|d| d.attempt == first)
        .map(|d| d.text.as_str())
        .collect();
    assert!(
        !shown.is_empty() && killed.starts_with(&shown),
        "the client saw the first attempt only"
    );

    // The same request again (same idempotency key): the stored turn, streamed whole.
    let again = client
        .post(&chat_url)
        .header("Idempotency-Key", "k1")
        .json(&request)
        .send()
        .await
        .unwrap();
    let text = again.text().await.unwrap();
    let events = sse_events(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    assert_eq!(sse_content(&sse_chunks(&events)), reply);
    drop(api);
    terminate(rescuer).await;
}
