//! The interfaces users see: the kvserver HTTP API on loopback, the monitoring views on a
//! fixture queue, Prometheus metrics, and batch replay with `--check`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use kvmem::runner::{self, Deps};
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// `metrics` is what `/metrics` renders: the test's own registry, never another test's.
async fn start(
    deps: Option<Deps>,
    pool: &PgPool,
    settings: kvmem::config::Settings,
    metrics: Arc<kvmem::metrics::Metrics>,
) -> Served {
    let state = crate::common::http_state(pool.clone(), Arc::new(settings), "ab".repeat(32))
        .with_metrics(metrics);
    serve(state, deps).await
}

fn chat(session: &str, user: &str, character: i64, text: &str) -> Value {
    json!({
        "model": "kvmem-test",
        "session_id": session,
        "user": user,
        "character_id": character,
        "messages": [{"role": "system", "content": "ignored"}, {"role": "user", "content": text}],
    })
}

#[sqlx::test(migrations = false)]
async fn chat_completions_and_its_errors(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let other = character(&pool, "u2", "Bob").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(json!({"kv_dir": dir.path(), "n_ctx": 1024, "reply_max_tokens": 16}));
    let deps = llama_deps(
        &pool,
        s.clone(),
        load_engine(&tiny_model(), &s),
        "http-worker",
    );
    let metrics = deps.metrics.clone();
    let server = start(Some(deps), &pool, s, metrics).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", server.base);

    let r = client
        .post(&url)
        .json(&chat("s1", "u1", ch, "Hello there"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert!(body["choices"][0]["message"]["content"].is_string());
    assert_eq!(body["kvmem"]["cold"], true);
    assert!(body["usage"]["completion_tokens"].as_i64().unwrap() > 0);
    // Cold: the whole prompt (base, HUD, digest, message) was decoded, none of it cached.
    let prompt = body["usage"]["prompt_tokens"].as_i64().unwrap();
    assert!(prompt > 20, "{body}");
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // Headers work too, and the second turn is warm.
    let r = client
        .post(&url)
        .header("X-Session-Id", "s1")
        .header("X-User-Id", "u1")
        .header("X-Character-Id", ch.to_string())
        .json(&json!({"messages": [{"role": "user", "content": "And now?"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["kvmem"]["cold"], false);
    // Warm: the snapshot held the first exchange, more than the whole first prompt.
    let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_i64()
        .unwrap();
    assert!(cached > prompt, "{body}");
    assert!(body["usage"]["prompt_tokens"].as_i64().unwrap() > cached);

    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (
            client.post(&url).json(&chat("s2", "u1", ch, "   ")),
            400,
            "message must not be empty",
        ),
        (
            client
                .post(&url)
                .json(&chat("s2", "u1", ch, &"x".repeat(9000))),
            400,
            "over the limit",
        ),
        (
            client.post(&url).json(&chat("s2", "u1", ch, "bell \u{7}")),
            400,
            "control characters",
        ),
        (
            client
                .post(&url)
                .json(&chat("s2", "u1", ch, "nul \u{0} byte")),
            400,
            "0x00",
        ),
        (
            client.post(&url).json(&chat("", "u1", ch, "hi")),
            400,
            "session_id must not be blank",
        ),
        (
            client.post(&url).json(&chat("s2", "u1", 999_999, "hi")),
            404,
            "unknown character",
        ),
        (
            client.post(&url).json(&chat("s2", "u1", other, "hi")),
            404,
            "unknown character",
        ),
        (
            client
                .post(&url)
                .body(vec![0xff, 0xfe, 0x7b])
                .header("content-type", "application/json"),
            400,
            "not valid UTF-8",
        ),
        (
            client
                .post(&url)
                .body("{not json")
                .header("content-type", "application/json"),
            400,
            "invalid request JSON",
        ),
        (
            client
                .post(&url)
                .json(&json!({"messages": [{"role": "user", "content": "hi"}]})),
            400,
            "missing user id",
        ),
        (
            client.post(&url).json(
                &json!({"session_id": "s2", "user": "u1", "character_id": ch, "messages": []}),
            ),
            400,
            "no user message",
        ),
    ];
    for (req, status, text) in cases {
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{text}");
        let body: Value = r.json().await.unwrap();
        let msg = body["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(text), "expected {text:?} in {body}");
    }
    // A message that can never fit N_CTX is a failed turn: 400 with the engine's reason.
    let r = client
        .post(&url)
        .json(&chat("s3", "u1", ch, &"word ".repeat(1500)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not fit"),
        "{body}"
    );
    // Nothing bad was queued: only the three real turns exist.
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 3);
}

#[sqlx::test(migrations = false)]
async fn chat_times_out_with_504_when_no_worker_runs(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let server = start(None, &pool, settings(json!({})), Default::default()).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .header("X-Timeout-Ms", "300")
        .json(&chat("s1", "u1", ch, "anyone?"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    // The turn goes on: a client must not retry it into a second turn of the same message.
    assert_eq!(
        r.headers()
            .get("x-should-retry")
            .map(|v| v.to_str().unwrap()),
        Some("false")
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "timeout");
    assert_eq!(body["error"]["state"], "queued");
    assert!(body["error"]["turn_id"].as_i64().is_some());
}

#[sqlx::test(migrations = false)]
async fn rotate_hint_info_and_metrics(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    fact(&pool, "s1", "debt", "bank", "Owes 5").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(
        json!({"kv_dir": dir.path(), "n_ctx": 1024, "kv_tail_tokens": 200, "reply_max_tokens": 16}),
    );
    let deps = llama_deps(&pool, s.clone(), load_engine(&tiny_model(), &s), "w");
    for msg in ["one", "two", "three"] {
        one_turn(&deps, "s1", "u1", ch, msg).await;
    }
    let server = start(None, &pool, s, deps.metrics.clone()).await;
    let client = reqwest::Client::new();

    let hint: Value = client
        .get(format!("{}/v1/rotate-hint?sid=s1&user=u1", server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tokens = hint["tokens_in_kv"].as_u64().unwrap();
    assert!(tokens > 0 && tokens <= 200, "{hint}");
    assert_eq!(hint["kv_tail_tokens"], 200);
    assert_eq!(
        hint["will_prune"],
        tokens + hint["next_turn_tokens_estimate"].as_u64().unwrap() > 200
    );
    assert_eq!(hint["digest_version"], hint["kv_digest_version"]);
    assert_eq!(hint["digest_changed_since_kv"], false);
    assert!(hint["digest_last_injected_at"].is_string());
    let r = client
        .get(format!("{}/v1/rotate-hint?sid=nope&user=u1", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = client
        .get(format!("{}/v1/rotate-hint", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    let info: Value = client
        .get(format!("{}/v1/info", server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["model_sha"], "ab".repeat(32));
    assert_eq!(info["kv_type_k"], "f16");
    assert!(info["bpt"].as_i64().unwrap() > 0);
    assert_eq!(info["config"]["kv_tail_tokens"], 200);
    assert!(
        info["config"].get("database_url").is_none(),
        "secrets must not leak"
    );

    let r = client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text");
    let value = |name: &str| {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum::<f64>()
    };
    // This test's own registry: exactly its three turns.
    assert_eq!(value("kvmem_turns_total"), 3.0, "{text}");
    assert_eq!(value("kvmem_queue_depth"), 3.0, "{text}");
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric == "kvmem_turn_latency_ms"),
        "{text}"
    );
    assert!(value("kvmem_kv_bytes") > 0.0);
}

#[sqlx::test(migrations = false)]
async fn monitoring_views_report_a_fixture_queue(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let q = |sid: &str, msg: &str| {
        let pool = pool.clone();
        let (sid, msg) = (sid.to_string(), msg.to_string());
        async move {
            kvmem::queue::enqueue(&pool, &sid, "u1", ch, &msg, None)
                .await
                .unwrap()
        }
    };
    // Fixture: s1 has 3 turns, the first running under an expired lease; s2 has 1 queued;
    // s3 one dead; "done" two done.
    let done1 = q("done", "a").await;
    let done2 = q("done", "b").await;
    let deps = echo_deps(&pool, settings(json!({})), "w");
    assert_eq!(drain(&deps).await.len(), 2);
    for m in ["x", "y", "z"] {
        q("s1", m).await;
    }
    q("s2", "stuck").await;
    let lanes = vec!["live".to_string()];
    let stuck = kvmem::queue::claim(&pool, "ghost", 1, &lanes)
        .await
        .unwrap()
        .unwrap();
    let dead = q("s3", "dies").await;
    sqlx::query("UPDATE turns SET state = 'dead', error = 'boom', attempts = 5 WHERE id = $1")
        .bind(dead.0)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE session_locks SET head_turn_id = NULL WHERE session_id = 's3'")
        .execute(&pool)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let stats: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT state::text, lane, turns FROM kvmem_queue_stats WHERE turns > 0 ORDER BY 1, 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        stats,
        vec![
            ("dead".into(), "live".into(), 1),
            ("done".into(), "live".into(), 2),
            ("queued".into(), "live".into(), 3),
            ("running".into(), "live".into(), 1),
        ]
    );
    let (queued, age): (i64, f64) =
        sqlx::query_as("SELECT queued, age_s FROM kvmem_oldest_queued WHERE lane = 'live'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(queued, 3);
    assert!(age >= 0.0);
    let running: Vec<(i64, String)> = sqlx::query_as("SELECT turn_id, owner FROM kvmem_running")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(running, vec![(stuck.id.0, "ghost".to_string())]);
    let stuck_rows: Vec<i64> = sqlx::query_scalar("SELECT turn_id FROM kvmem_stuck")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(stuck_rows, vec![stuck.id.0]);
    let dead_rows: Vec<(i64, String)> = sqlx::query_as("SELECT turn_id, error FROM kvmem_dead")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(dead_rows, vec![(dead.0, "boom".to_string())]);
    let backlog: Vec<(String, i64, bool)> =
        sqlx::query_as("SELECT session_id, pending, running FROM kvmem_session_backlog")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(stuck.session_id, "s1");
    assert_eq!(
        backlog,
        vec![("s1".into(), 3, true), ("s2".into(), 1, false)]
    );
    let done_per_minute: i64 = sqlx::query_scalar("SELECT sum(done)::bigint FROM kvmem_throughput")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(done_per_minute, 2);
    let (turns, p50): (i64, Option<f64>) =
        sqlx::query_as("SELECT turns, p50_ms FROM kvmem_latency")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(turns, 2);
    assert!(p50.is_some());
    sqlx::query("UPDATE turn_log SET cold = (turn_id = $1)")
        .bind(done1.0)
        .execute(&pool)
        .await
        .unwrap();
    let (warm, cold, ratio): (i64, i64, f64) =
        sqlx::query_as("SELECT warm, cold, warm_ratio FROM kvmem_warm_ratio")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((warm, cold), (1, 1));
    assert!((ratio - 0.5).abs() < 1e-9);
    let _ = done2;
}

#[sqlx::test(migrations = false)]
async fn replay_reproduces_replies_and_check_catches_a_change(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    fact(&pool, "rec", "quest", "relic", "Find the relic").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(
        json!({"kv_dir": dir.path(), "n_ctx": 1024, "kv_tail_tokens": 200, "reply_max_tokens": 16}),
    );
    let engine = load_engine(&tiny_model(), &s);
    let live = llama_deps(&pool, s.clone(), engine.clone(), "live");
    for msg in ["Hello", "Where to?", "How long?", "And then?", "Thanks"] {
        one_turn(&live, "rec", "u1", ch, msg).await;
    }
    let replay_settings = s.with(json!({"lanes": ["replay"]})).unwrap();
    let replayer = llama_deps(&pool, replay_settings, engine, "replayer");
    let shutdown = CancellationToken::new();
    tokio::spawn(runner::run(replayer, shutdown.clone()));

    let scenes = kvmem::cmd::replay::scenes_from_db(&pool, &["rec".to_string()])
        .await
        .unwrap();
    let report = kvmem::cmd::replay::run(&pool, &scenes, "r1", Duration::from_secs(600), false)
        .await
        .unwrap();
    assert_eq!(report.turns.len(), 5);
    assert_eq!(report.failures, 0);
    assert_eq!(
        report.divergences,
        0,
        "{}",
        kvmem::cmd::replay::summary(&report)
    );
    assert!(report.turns.iter().all(|t| t.identical == Some(true)));
    assert_eq!(report.turns[0].cold, Some(true));
    assert!(report.turns[1..].iter().all(|t| t.cold == Some(false)));
    let lanes: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT lane FROM turns WHERE session_id LIKE 'replay:%'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(lanes, ["replay"]);

    // Alter a recorded reply: the next replay must report the divergence.
    sqlx::query("UPDATE turns SET reply = reply || ' (edited)' WHERE id = (SELECT id FROM turns WHERE session_id = 'rec' ORDER BY id OFFSET 2 LIMIT 1)")
        .execute(&pool)
        .await
        .unwrap();
    let scenes = kvmem::cmd::replay::scenes_from_db(&pool, &["rec".to_string()])
        .await
        .unwrap();
    let report = kvmem::cmd::replay::run(&pool, &scenes, "r2", Duration::from_secs(600), false)
        .await
        .unwrap();
    assert_eq!(report.divergences, 1);
    assert_eq!(report.turns[2].identical, Some(false));
    assert!(kvmem::cmd::replay::summary(&report).contains("DIFFERS"));
    shutdown.cancel();

    // The CLI's --check turns that into a non-zero exit.
    let url = db_url(&pool).await;
    let out = kvmem_command(&url)
        .args(["replay", "--session", "rec", "--check", "--report"])
        .arg(dir.path().join("report.json"))
        .env("KVMEM_MODEL_PATH", tiny_model())
        .env("KVMEM_KV_DIR", dir.path())
        .env("N_CTX", "1024")
        .env("KV_TAIL_TOKENS", "200")
        .env("REPLY_MAX_TOKENS", "16")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("replay check failed"));
    let report: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(report["divergences"], 1);
}

#[sqlx::test(migrations = false)]
async fn replay_lane_waits_while_live_turns_are_ready(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    // Replay turns are older (lower ids) than the live ones, yet live goes first.
    for i in 0..3 {
        let session_id = format!("r{i}");
        let turn = kvmem::queue::NewTurn {
            session_id: &session_id,
            user_id: "u1",
            character_id: ch,
            message: "replayed",
            idempotency_key: None,
            options: None,
        };
        kvmem::queue::enqueue_on(&pool, &turn, "replay")
            .await
            .unwrap();
    }
    for i in 0..3 {
        kvmem::queue::enqueue(&pool, &format!("l{i}"), "u1", ch, "live", None)
            .await
            .unwrap();
    }
    let deps = echo_deps(&pool, settings(json!({})), "w");
    drain(&deps).await;
    let order: Vec<String> = sqlx::query_scalar("SELECT lane FROM turns ORDER BY started_at")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        order,
        ["live", "live", "live", "replay", "replay", "replay"]
    );
}
