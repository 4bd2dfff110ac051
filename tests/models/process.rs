//! The `kvmem` binary as ops run it: a worker process that is killed and restarted resumes
//! the scene warm, and the CLI reports bad input clearly. And a reply that streams while it
//! is generated, as a backend reads it with plain LISTEN, as the OpenAI SDK and `curl -N`
//! read it over HTTP, and as a client that goes away mid-stream leaves it. (A worker killed
//! mid-stream is in `tests/models/fencing.rs`.)

use crate::common;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kvmem::config::Settings;
use serde_json::{json, Value};
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

/// `kvmem serve` says in `/v1/info` and in its start-up log where each model runs. In a
/// build without a GPU feature, layers asked of a GPU leave the model on the CPU, with a
/// warning that says so.
#[sqlx::test(migrations = false)]
async fn serve_says_which_backend_and_device_each_model_runs_on(pool: PgPool) {
    migrate(&pool).await;
    let url = db_url(&pool).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let mut child = kvmem_command(&url)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--generator", "llama"])
        .env("KVMEM_MODEL_PATH", tiny_model())
        .env("KVMEM_MEMORY_EMBED_MODEL_PATH", minilm())
        .env("KVMEM_KV_DIR", dir.path())
        .env("KVMEM_GPU_LAYERS", "999")
        .env("KVMEM_LOG_LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start kvmem serve");
    // Waiting for a process to listen is real time: poll it, within a bound.
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let info: Value = loop {
        let r = client
            .get(format!("http://127.0.0.1:{port}/v1/info"))
            .send()
            .await;
        if let Ok(r) = r {
            break r.json().await.unwrap();
        }
        assert!(Instant::now() < deadline, "serve did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = child.kill();
    child.wait().unwrap();
    let log = std::fs::read_to_string(&log).unwrap();
    let chat = &info["devices"]["chat"];
    let embedder = &info["devices"]["embedder"];
    // The tiny model has 2 layers and MiniLM-L6 6, each with its output layer.
    assert_eq!(chat["layers"], 3, "{info}");
    assert_eq!(embedder["layers"], 7, "{info}");
    if cfg!(not(any(feature = "vulkan", feature = "cuda"))) {
        assert_eq!(info["backend"], "CPU", "{info}");
        assert_eq!(chat["device"], "CPU", "{info}");
        assert_eq!(chat["offloaded_layers"], 0, "{info}");
        assert_eq!(embedder["backend"], "CPU", "{info}");
        assert!(
            log.contains("GPU layers asked for, but llama.cpp lists no GPU device"),
            "{log}"
        );
    }
    let loaded = log
        .lines()
        .find(|l| l.contains("model loaded") && l.contains("model_sha="))
        .unwrap_or("");
    assert!(
        loaded.contains(&format!("backend={}", info["backend"].as_str().unwrap())),
        "{log}"
    );
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

/// A SmolLM2 worker and the HTTP API in this process, as `kvmem serve` runs them, on a pool
/// of their own: they hold several listening connections, and the test's pool has five.
async fn smollm2_api(pool: &PgPool, s: Settings, worker_id: &str) -> Served {
    let own = kvmem::system::connect_url(&db_url(pool).await, 16)
        .await
        .unwrap();
    let deps = llama_deps(&own, s.clone(), load_engine(&smollm2(), &s), worker_id);
    let state = crate::common::http_state(own, Arc::new(s), "ab".repeat(32));
    serve(state, Some(deps)).await
}

/// A chat request with `"stream": true`.
fn streamed(session: &str, user: &str, character: i64, text: &str) -> Value {
    json!({"session_id": session, "user": user, "character_id": character, "stream": true,
           "messages": [{"role": "user", "content": text}]})
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
        let (reply, token) = stored_reply(&pool, id).await;
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

/// A client that goes away after the first content chunk, while the turn still runs:
/// the turn completes and is stored whole, with what the client saw as its start.
#[sqlx::test(migrations = false)]
async fn a_client_that_disconnects_mid_stream_leaves_a_stored_turn(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(json!({"kv_dir": dir.path(), "n_ctx": 1024, "reply_max_tokens": 48}));
    let api = smollm2_api(&pool, s, "w-gone").await;
    let base = &api.base;
    let url = format!("{base}/v1/chat/completions");
    let request = streamed(
        "s-gone",
        "u1",
        ch,
        "Tell me a long story about the outpost.",
    );
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
        let chunks = sse_chunks(&sse_events(&seen));
        let text = sse_content(&chunks);
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
}

/// OpenAI's finish reason for a reply of `r` tokens under a budget of `max`: a reply that
/// used all of it was cut off.
fn finish_at(r: i32, max: i32) -> &'static str {
    if r >= max {
        "length"
    } else {
        "stop"
    }
}

/// What the OpenAI Python SDK prints of a streamed chat: each chunk as a JSON line. Then
/// the same call without `stream`, as one line.
const SDK_SCRIPT: &str = r#"
import json, sys, openai
base, session, character = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
ask = lambda text, **kw: client.chat.completions.create(
    model="kvmem", messages=[{"role": "user", "content": text}], user="u1",
    extra_body={"session_id": session, "character_id": character}, **kw)
for chunk in ask("We landed at the outpost. What do you see?", stream=True,
                 stream_options={"include_usage": True}):
    print(json.dumps(chunk.model_dump()), flush=True)
print(json.dumps(ask("And the guards?").model_dump()), flush=True)
"#;

/// `"stream": true` on SmolLM2, through the official OpenAI SDK and through `curl -N`:
/// the role first, content in several chunks, the finish, usage, `[DONE]`; the content
/// joined is the stored reply. Bad input is an HTTP error with a JSON body, before any SSE.
#[sqlx::test(migrations = false)]
async fn chat_streams_to_the_openai_sdk_and_curl(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(
        json!({"kv_dir": dir.path(), "n_ctx": 1024, "kv_tail_tokens": 900,
                            "reply_max_tokens": 32}),
    );
    let api = smollm2_api(&pool, s, "sse-worker").await;
    let base = &api.base;
    let reply_of = |id: i64| {
        let pool = pool.clone();
        async move { stored_reply(&pool, id).await.0 }
    };

    let out = tokio::process::Command::new(openai_python())
        .args([
            "-c",
            SDK_SCRIPT,
            &format!("{base}/v1"),
            "s-sdk",
            &ch.to_string(),
        ])
        .output()
        .await
        .unwrap();
    assert_success(&out);
    let mut lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let plain = lines.pop().unwrap();
    let chunks = lines;
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["kvmem"]["cold"], true);
    let id = chunks[0]["kvmem"]["turn_id"].as_i64().unwrap();
    let texts = chunks
        .iter()
        .filter(|c| !sse_content(std::slice::from_ref(c)).is_empty())
        .count();
    assert!(texts >= 2, "{texts} content chunks");
    assert_eq!(sse_content(&chunks), reply_of(id).await);
    let n = chunks.len();
    assert_eq!(
        chunks[n - 1]["choices"],
        json!([]),
        "the usage chunk comes last"
    );
    let usage = &chunks[n - 1]["usage"];
    let (prompt, prefill, r): (i32, i32, i32) = sqlx::query_as(
        "SELECT prompt_tokens, prefill_tokens, r_tokens FROM turn_log WHERE turn_id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(usage["prompt_tokens"], json!(prompt));
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"],
        json!(prompt - prefill)
    );
    assert_eq!(usage["completion_tokens"], json!(r));
    assert_eq!(
        chunks[n - 2]["choices"][0]["finish_reason"],
        finish_at(r, 32),
        "{r} tokens"
    );
    // The same SDK without `stream`: a whole completion, warm, its cache counted.
    assert_eq!(plain["object"], "chat.completion");
    assert_eq!(plain["kvmem"]["cold"], false);
    let plain_id = plain["kvmem"]["turn_id"].as_i64().unwrap();
    assert_eq!(
        plain["choices"][0]["message"]["content"],
        json!(reply_of(plain_id).await)
    );
    assert!(
        plain["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_i64()
            .unwrap()
            > 0
    );

    // curl -N: the raw events, as a front-end without the SDK reads them.
    let curl = |body: Value| {
        tokio::process::Command::new("curl")
            .args([
                "-N",
                "-s",
                "-D",
                "/dev/stderr",
                "-H",
                "content-type: application/json",
            ])
            .args([
                "-d",
                &body.to_string(),
                &format!("{base}/v1/chat/completions"),
            ])
            .output()
    };
    let ask = streamed("s-curl", "u1", ch, "What is the weather like?");
    let out = curl(ask).await.unwrap();
    let head = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    let events = sse_events(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(e, d)| {
            assert_eq!(e, &None, "{d}");
            serde_json::from_str(d).unwrap()
        })
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let id = chunks[0]["kvmem"]["turn_id"].as_i64().unwrap();
    assert_eq!(sse_content(&chunks), reply_of(id).await);
    let r: i32 = sqlx::query_scalar("SELECT r_tokens FROM turn_log WHERE turn_id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        finish_at(r, 32),
        "{r} tokens"
    );
    assert!(
        chunks.iter().all(|c| c.get("usage").is_none()),
        "no usage unless asked"
    );

    // Errors found before the first byte stay HTTP errors with JSON bodies.
    let other = character(&pool, "u2", "Bob").await;
    for (session, character, text, status, says) in [
        ("s-bad", ch, "   ", "400", "message must not be empty"),
        ("s-bad", other, "hi", "404", "unknown character"),
        ("s-bad", ch, &"word ".repeat(1500), "400", "does not fit"),
    ] {
        let ask = streamed(session, "u1", character, text);
        let out = curl(ask).await.unwrap();
        let head = String::from_utf8_lossy(&out.stderr).to_lowercase();
        assert!(head.starts_with(&format!("http/1.1 {status}")), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        let body: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{body}"
        );
    }
}
