//! Requests that land once and right, through the official OpenAI Python SDK at its default
//! retries on SmolLM2: a request the server fails with a 5xx after its turn was queued is
//! retried by the SDK into that same turn (one turn, one stored reply, which the client
//! gets), whole or streamed; the same message sent again on purpose after its reply is a
//! second turn; and `finish_reason` says "length" when `REPLY_MAX_TOKENS` cut the reply.
//! (The rules for a repeat, driven without a model, are in `tests/queue/retries.rs`.)

use crate::common;

use std::sync::Arc;

use common::*;
use kvmem::config::Settings;
use kvmem::faults::HttpFaults;
use serde_json::{json, Value};
use sqlx::PgPool;

/// A SmolLM2 worker and the HTTP API in this process, as `kvmem serve` runs them, with the
/// chat endpoint failing requests as `faults` scripts; on a pool of their own (they hold
/// listening connections, and the test's pool has five).
async fn api(pool: &PgPool, s: Settings, faults: &str, worker_id: &str) -> Served {
    let own = kvmem::system::connect_url(&db_url(pool).await, 16)
        .await
        .unwrap();
    let deps = llama_deps(&own, s.clone(), load_engine(&smollm2(), &s), worker_id);
    let state = crate::common::http_state(own, Arc::new(s), "ab".repeat(32))
        .with_faults(HttpFaults::parse(faults).unwrap());
    serve(state, Some(deps)).await
}

/// Asks each text after argv[5] in turn through the SDK at its default retries (whole, or
/// streamed when argv[4] is "stream"), and prints per text one JSON line: the completion
/// (or the chunks) and every HTTP attempt the SDK made, with the retry count it sent and
/// the status and `x-should-retry` it got.
const SDK_SCRIPT: &str = r#"
import json, sys, openai
base, session, character, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
seen = []
def on_request(r):
    seen.append({"retry_count": r.headers.get("x-stainless-retry-count")})
def on_response(r):
    seen[-1].update(status=r.status_code, should_retry=r.headers.get("x-should-retry"))
hooks = {"request": [on_request], "response": [on_response]}
client = openai.OpenAI(base_url=base, api_key="unused",
                       http_client=openai.DefaultHttpxClient(event_hooks=hooks))
for text in sys.argv[5:]:
    kw = dict(model="kvmem", messages=[{"role": "user", "content": text}], user="u1",
              extra_body={"session_id": session, "character_id": character})
    if mode == "stream":
        out = {"chunks": [c.model_dump() for c in client.chat.completions.create(stream=True, **kw)]}
    else:
        out = {"completion": client.chat.completions.create(**kw).model_dump()}
    out["attempts"] = seen[:]
    seen.clear()
    print(json.dumps(out), flush=True)
"#;

/// One JSON line per text, as [`SDK_SCRIPT`] prints them.
async fn sdk(base: &str, session: &str, ch: i64, mode: &str, texts: &[&str]) -> Vec<Value> {
    let out = tokio::process::Command::new(openai_python())
        .args(["-c", SDK_SCRIPT, &format!("{base}/v1"), session])
        .arg(ch.to_string())
        .arg(mode)
        .args(texts)
        .output()
        .await
        .unwrap();
    assert_success(&out);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What the SDK's attempts were: (retry count sent, status, `x-should-retry` got).
fn attempts(line: &Value) -> Vec<(String, u16, Option<String>)> {
    line["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["retry_count"].as_str().unwrap().to_string(),
                a["status"].as_u64().unwrap() as u16,
                a["should_retry"].as_str().map(str::to_string),
            )
        })
        .collect()
}

fn failed(count: &str, status: u16) -> (String, u16, Option<String>) {
    (count.to_string(), status, Some("true".to_string()))
}

fn answered(count: &str) -> (String, u16, Option<String>) {
    (count.to_string(), 200, None)
}

/// The session's turns (id, attempts, reply) and its dialogue rows.
async fn session_rows(pool: &PgPool, sid: &str) -> (Vec<(i64, i32, String)>, i64) {
    let turns = sqlx::query_as(
        "SELECT id, attempts, coalesce(reply, '') FROM turns WHERE session_id = $1 ORDER BY id",
    )
    .bind(sid)
    .fetch_all(pool)
    .await
    .unwrap();
    let messages: i64 = sqlx::query_scalar("SELECT count(*) FROM messages WHERE session_id = $1")
        .bind(sid)
        .fetch_one(pool)
        .await
        .unwrap();
    (turns, messages)
}

/// The turn's committed log row: why generation stopped, and the reply's tokens.
async fn finish_of(pool: &PgPool, turn_id: i64) -> (Option<String>, i32) {
    sqlx::query_as(
        "SELECT finish_reason, r_tokens FROM turn_log
          WHERE turn_id = $1 AND status = 'OK' ORDER BY id DESC LIMIT 1",
    )
    .bind(turn_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Room enough for SmolLM2's short answer to end by itself, so its reply stops.
const ROOMY: u32 = 96;
const SHORT_ANSWER: &str = "Say hello.";

/// Whole replies: the first attempt fails with 500 just after its turn is queued, the
/// second with 502 after the turn is done, before its answer; the SDK's third attempt gets
/// the reply of that one turn. Then the same message again, on purpose: a second turn.
#[sqlx::test(migrations = false)]
async fn sdk_retries_after_a_5xx_are_the_turn_the_first_attempt_queued(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(json!({"kv_dir": dir.path(), "n_ctx": 1024, "reply_max_tokens": ROOMY}));
    let api = api(&pool, s, "500@queued,502@done", "w-retry").await;
    let lines = sdk(
        &api.base,
        "s-retry",
        ch,
        "json",
        &[SHORT_ANSWER, SHORT_ANSWER],
    )
    .await;

    assert_eq!(
        attempts(&lines[0]),
        vec![failed("0", 500), failed("1", 502), answered("2")]
    );
    assert_eq!(attempts(&lines[1]), vec![answered("0")]);
    let (turns, messages) = session_rows(&pool, "s-retry").await;
    assert_eq!(turns.len(), 2, "{turns:?}");
    assert_eq!(messages, 4, "each turn's message and reply, once");
    for (line, (id, runs, reply)) in lines.iter().zip(&turns) {
        let c = &line["completion"];
        assert_eq!(c["kvmem"]["turn_id"], json!(id));
        assert_eq!(*runs, 1, "turn {id} ran once");
        assert_eq!(c["choices"][0]["message"]["content"], json!(reply));
        assert!(!reply.is_empty());
        let (finish, r_tokens) = finish_of(&pool, *id).await;
        assert!((r_tokens as u32) < ROOMY, "{r_tokens} tokens: {reply:?}");
        assert_eq!(finish.as_deref(), Some("stop"));
        assert_eq!(c["choices"][0]["finish_reason"], "stop");
    }
}

/// Streamed: 503 just after the turn is queued, 502 when the first chunk is ready but not
/// yet sent; the SDK's third attempt streams that turn's reply from its stored deltas.
#[sqlx::test(migrations = false)]
async fn sdk_stream_retries_after_a_5xx_are_the_turn_the_first_attempt_queued(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(json!({"kv_dir": dir.path(), "n_ctx": 1024, "reply_max_tokens": ROOMY}));
    let api = api(&pool, s, "503@queued,502@started", "w-retry-sse").await;
    let lines = sdk(&api.base, "s-retry-sse", ch, "stream", &[SHORT_ANSWER]).await;

    assert_eq!(
        attempts(&lines[0]),
        vec![failed("0", 503), failed("1", 502), answered("2")]
    );
    let (turns, messages) = session_rows(&pool, "s-retry-sse").await;
    assert_eq!(turns.len(), 1, "{turns:?}");
    assert_eq!(messages, 2);
    let (id, runs, reply) = &turns[0];
    assert_eq!(*runs, 1);
    let chunks: Vec<Value> = lines[0]["chunks"].as_array().unwrap().clone();
    assert_eq!(chunks[0]["kvmem"]["turn_id"], json!(id));
    assert_eq!(&sse_content(&chunks), reply);
    assert!(!reply.is_empty());
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(finish_of(&pool, *id).await.0.as_deref(), Some("stop"));
}

/// A reply cut at a small `REPLY_MAX_TOKENS` says "length", whole and streamed, and its
/// log row records it.
#[sqlx::test(migrations = false)]
async fn a_reply_cut_at_reply_max_tokens_finishes_with_length(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(json!({"kv_dir": dir.path(), "n_ctx": 1024, "reply_max_tokens": 4}));
    let api = api(&pool, s, "", "w-length").await;
    let story = "Tell me a long story about the outpost.";
    let whole = sdk(&api.base, "s-length", ch, "json", &[story]).await;
    let streamed = sdk(&api.base, "s-length", ch, "stream", &[story]).await;

    let (turns, _) = session_rows(&pool, "s-length").await;
    assert_eq!(turns.len(), 2, "{turns:?}");
    let c = &whole[0]["completion"];
    assert_eq!(c["kvmem"]["turn_id"], json!(turns[0].0));
    assert_eq!(c["choices"][0]["finish_reason"], "length");
    let chunks = streamed[0]["chunks"].as_array().unwrap();
    assert_eq!(chunks[0]["kvmem"]["turn_id"], json!(turns[1].0));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    for (id, _, _) in &turns {
        assert_eq!(finish_of(&pool, *id).await, (Some("length".into()), 4));
    }
}
