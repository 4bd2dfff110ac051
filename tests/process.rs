//! The `kvmem` binary as ops run it: a worker process that is killed and restarted resumes
//! the scene warm, and the CLI reports bad input clearly. And a reply that streams through
//! Postgres while it is generated: read with plain LISTEN, and relayed by the HTTP API,
//! including when its worker is killed mid-stream and another one runs the turn again.

mod common;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

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

/// The SQL API's stream: every delta of a turn on its channel and on its session's, in
/// order, opening with a reset and closing with `done`, joined equal to the stored reply,
/// and what `kvmem_turn_stream` gives a late reader. Cold then warm, on SmolLM2, with the
/// usage figures the first delta carries checked against the turn before.
#[sqlx::test(migrations = false)]
async fn sql_listeners_read_the_reply_as_it_is_generated(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(
        json!({"kv_dir": dir.path(), "n_ctx": 1024, "kv_tail_tokens": 900,
                            "reply_max_tokens": 24}),
    );
    let deps = llama_deps(&pool, s.clone(), load_engine(&smollm2(), &s), "w-stream");
    let mut by_session = StreamTap::session(&pool, "s-stream").await;
    let mut kv_before = 0;
    for (n, msg) in [
        "We landed at the outpost. What do you see?",
        "And the guards?",
    ]
    .into_iter()
    .enumerate()
    {
        let id = kvmem::queue::enqueue(&pool, "s-stream", "u1", ch, msg, None)
            .await
            .unwrap()
            .0;
        let mut by_turn = StreamTap::turn(&pool, id).await;
        assert_eq!(drain(&deps).await.len(), 1);
        let (deltas, state) = by_turn.until_end(id).await;
        assert_eq!(state, "done");
        let (reply, token): (String, i64) =
            sqlx::query_as("SELECT reply, done_token FROM turns WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        let attempts: BTreeSet<i64> = deltas.iter().map(|d| d.attempt).collect();
        assert_eq!(
            attempts,
            BTreeSet::from([token]),
            "one attempt: the committed one"
        );
        assert_eq!(joined_attempt(&deltas, token), reply);
        let texts = deltas.iter().filter(|d| !d.text.is_empty()).count();
        assert!(texts >= 2, "the reply came in {texts} pieces: {deltas:?}");
        assert_eq!(by_session.until_end(id).await, (deltas.clone(), state));

        let late: (String, i64, Option<i32>, String, bool) =
            sqlx::query_as("SELECT state, attempt, seq, text, done FROM kvmem_turn_stream($1)")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        let last = deltas.last().unwrap().seq;
        assert_eq!(
            late,
            ("done".into(), token, Some(last), reply.clone(), true)
        );

        let (prompt, prefill, cold, kv): (i32, i32, bool, i32) = sqlx::query_as(
            "SELECT prompt_tokens, prefill_tokens, cold, tokens_in_kv FROM turn_log WHERE turn_id = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        let meta = deltas[0].meta.clone().unwrap();
        assert_eq!(meta["cold"], json!(n == 0));
        assert_eq!(
            (meta["prompt_tokens"].as_i64(), cold),
            (Some(prompt as i64), n == 0)
        );
        // Cold: all of the prompt was decoded. Warm: the snapshot held the last turn's KV
        // (under the tail, so unpruned) and the turn decoded only the rest.
        let cached = prompt - prefill;
        assert_eq!(cached, kv_before, "cached = the KV the last turn saved");
        assert_eq!(meta["cached_tokens"], json!(cached));
        kv_before = kv;
    }
    let names: (String, String) =
        sqlx::query_as("SELECT kvmem_turn_channel(42), kvmem_listen_turn(42)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        names,
        (
            kvmem::stream::follow::channel(42),
            kvmem::stream::follow::channel(42)
        )
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
    let logs = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stream-kill");
    std::fs::create_dir_all(&logs).unwrap();
    let spawn = |stop: bool| {
        let log = std::fs::File::create(logs.join(format!("worker-{stop}.log"))).unwrap();
        let mut cmd = kvmem_command(&url);
        cmd.args(["worker", "--generator", "llama"])
            .env("KVMEM_MODEL_PATH", smollm2())
            .env("KVMEM_KV_DIR", dir.path())
            .env("N_CTX", "1024")
            .env("KV_TAIL_TOKENS", "900")
            .env("REPLY_MAX_TOKENS", "32")
            .env("KVMEM_LEASE_MS", "1500")
            .env("KVMEM_HEARTBEAT_MS", "300")
            .stdout(Stdio::null())
            .stderr(log);
        if stop {
            cmd.env("KVMEM_TEST_STOP_AT", "mid_stream");
        }
        cmd.spawn().expect("start kvmem worker")
    };
    let mut doomed = spawn(true);
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let chat_url = format!(
        "http://{}/v1/chat/completions",
        listener.local_addr().unwrap()
    );
    let state =
        kvmem::http::AppState::new(pool.clone(), Arc::new(settings(json!({}))), "ab".repeat(32));
    tokio::spawn(kvmem::http::serve(listener, state, shutdown.clone()));
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
    while !sse_events(&seen)
        .iter()
        .any(|(_, d)| d.contains("\"content\":\"") && !d.contains("\"content\":\"\""))
    {
        let bytes = body
            .chunk()
            .await
            .unwrap()
            .expect("SSE until the first content");
        seen.push_str(std::str::from_utf8(&bytes).unwrap());
    }
    // It stops itself right after that publish; the client may hear it a moment first.
    let deadline = Instant::now() + Duration::from_secs(30);
    while proc_state(doomed.id()) != Some('T') {
        assert!(
            Instant::now() < deadline,
            "the worker did not stop mid-stream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    let _rescuer = KillOnDrop(spawn(false));
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
    let (reply, token): (String, i64) =
        sqlx::query_as("SELECT reply, done_token FROM turns WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
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
    let shown: String = events
        .iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
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
    let content: String = events
        .iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(content, reply);
    shutdown.cancel();
}

/// The process state letter from /proc (`T` = stopped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A child process killed when the test ends, passing or not.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client that goes away after the first content chunk, while the turn still runs:
/// the turn completes and is stored whole, with what the client saw as its start.
#[sqlx::test(migrations = false)]
async fn a_client_that_disconnects_mid_stream_leaves_a_stored_turn(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(json!({"kv_dir": dir.path(), "n_ctx": 1024, "reply_max_tokens": 48}));
    // The worker and the server hold several listening connections: a pool of their own,
    // as `kvmem serve` has, rather than the test's five.
    let served = kvmem::db::connect(&db_url(&pool).await, 16).await.unwrap();
    let deps = llama_deps(&served, s.clone(), load_engine(&smollm2(), &s), "w-gone");
    let shutdown = CancellationToken::new();
    tokio::spawn(kvmem::runner::run(deps, shutdown.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/v1/chat/completions",
        listener.local_addr().unwrap()
    );
    let state = kvmem::http::AppState::new(served, Arc::new(s), "ab".repeat(32));
    tokio::spawn(kvmem::http::serve(listener, state, shutdown.clone()));
    let request = json!({"session_id": "s-gone", "user": "u1", "character_id": ch, "stream": true,
                         "messages": [{"role": "user", "content": "Tell me a long story about the outpost."}]});
    let mut body = reqwest::Client::new()
        .post(&url)
        .json(&request)
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    let shown = loop {
        let bytes = body
            .chunk()
            .await
            .unwrap()
            .expect("SSE until the first content");
        seen.push_str(std::str::from_utf8(&bytes).unwrap());
        let chunks: Vec<Value> = sse_events(&seen)
            .iter()
            .filter_map(|(_, d)| serde_json::from_str(d).ok())
            .collect();
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        if !text.is_empty() {
            break (chunks[0]["kvmem"]["turn_id"].as_i64().unwrap(), text);
        }
    };
    let (id, shown) = shown;
    let mut tap = StreamTap::turn(&pool, id).await;
    let (state, done): (String, bool) =
        sqlx::query_as("SELECT state, done FROM kvmem_turn_stream($1)")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (state.as_str(), done),
        ("running", false),
        "the client leaves mid-stream"
    );
    drop(body);
    let (_, end) = tap.until_end(id).await;
    assert_eq!(end, "done");
    let (reply, messages): (String, i64) = sqlx::query_as(
        "SELECT t.reply, (SELECT count(*) FROM messages m WHERE m.turn_id = t.id)
           FROM turns t WHERE t.id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        reply.starts_with(&shown) && reply.len() > shown.len(),
        "{shown:?} / {reply:?}"
    );
    assert_eq!(
        messages, 2,
        "the user's message and the whole reply are in the dialogue"
    );
    shutdown.cancel();
}
