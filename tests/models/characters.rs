//! Characters are models, through the official OpenAI Python SDK on SmolLM2: `/v1/models`
//! lists the caller's characters and no other user's, `model` picks one by the listed id or
//! the character's id, an unknown one is a 404 that lists the caller's models, and a
//! request's system message becomes the character's persona when `http.system_message` is
//! `persona` (reaching the next turn's prompt as a persona edit does), and is left alone
//! by default.

use crate::common;

use std::sync::Arc;

use common::*;
use kvmem::config::Settings;
use serde_json::{json, Value};
use sqlx::PgPool;

/// A SmolLM2 worker and the HTTP API in this process, as `kvmem serve` runs them, on a
/// pool of their own (they hold listening connections, and the test's pool has five).
pub async fn api(pool: &PgPool, s: Settings, worker_id: &str) -> Served {
    let own = kvmem::system::connect_url(&db_url(pool).await, 16)
        .await
        .unwrap();
    let deps = llama_deps(&own, s.clone(), load_engine(&smollm2(), &s), worker_id);
    serve(
        crate::common::http_state(own, Arc::new(s), "ab".repeat(32)),
        Some(deps),
    )
    .await
}

/// Runs each call (a JSON object after argv[1]) through the SDK without retries, and
/// prints one JSON line per call: the model ids listed, the completion, the stream's
/// chunks, or the status and error body the SDK raised.
const SDK_SCRIPT: &str = r#"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)
for arg in sys.argv[2:]:
    call = json.loads(arg)
    try:
        if call["kind"] == "models":
            page = client.models.list(extra_headers=call.get("headers"),
                                      extra_query=call.get("query"))
            out = {"ids": [m.id for m in page.data], "data": [m.model_dump() for m in page.data]}
        elif call.get("stream"):
            out = {"chunks": [c.model_dump() for c in
                              client.chat.completions.create(stream=True, **call["kw"])]}
        else:
            out = {"completion": client.chat.completions.create(**call["kw"]).model_dump()}
    except openai.APIStatusError as e:
        out = {"status": e.status_code, "error": e.body}
    print(json.dumps(out), flush=True)
"#;

/// One JSON line per call, as [`SDK_SCRIPT`] prints them.
pub async fn sdk(base: &str, calls: &[Value]) -> Vec<Value> {
    let out = tokio::process::Command::new(openai_python())
        .args(["-c", SDK_SCRIPT, &format!("{base}/v1")])
        .args(calls.iter().map(Value::to_string))
        .output()
        .await
        .unwrap();
    assert_success(&out);
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), calls.len());
    lines
}

/// A chat call: `user` asks `model` one message in `session`, with `more` SDK arguments.
pub fn chat(user: &str, model: &str, session: &str, text: &str, more: Value) -> Value {
    let mut kw = json!({
        "model": model, "user": user,
        "messages": [{"role": "user", "content": text}],
        "extra_body": {"session_id": session},
    });
    kw.as_object_mut()
        .unwrap()
        .extend(more.as_object().unwrap().clone());
    json!({"kind": "chat", "kw": kw})
}

/// The error object of a refused call (the SDK's `body` is it, or holds it).
pub fn error_of(line: &Value) -> &Value {
    let body = &line["error"];
    body.get("error").unwrap_or(body)
}

/// The session's turns: (character, reply).
async fn turns_of(pool: &PgPool, sid: &str) -> Vec<(i64, String)> {
    sqlx::query_as(
        "SELECT character_id, coalesce(reply, '') FROM turns WHERE session_id = $1 ORDER BY id",
    )
    .bind(sid)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn characters_are_models_listed_per_user_and_picked_by_name_or_id(pool: PgPool) {
    migrate(&pool).await;
    let ada = character(&pool, "u1", "Ada").await;
    let brun = character(&pool, "u1", "Brun").await;
    let cass = character(&pool, "u2", "Cass").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(json!({"kv_dir": dir.path(), "n_ctx": 1024, "reply_max_tokens": 8}));
    let api = api(&pool, s, "w-models").await;
    let none = json!({});
    let lines = sdk(
        &api.base,
        &[
            json!({"kind": "models", "headers": {"x-user-id": "u1"}}),
            json!({"kind": "models", "query": {"user": "u2"}}),
            chat("u1", "Ada", "s-ada", "Hello.", none.clone()),
            chat("u1", &brun.to_string(), "s-brun", "Hello.", none.clone()),
            chat("u1", "Zed", "s-zed", "Hello.", none.clone()),
            chat("u2", "Ada", "s-u2", "Hello.", none.clone()),
            chat("u1", "Cass", "s-cass", "Hello.", none.clone()),
            chat("u1", &cass.to_string(), "s-cass", "Hello.", none),
        ],
    )
    .await;

    assert_eq!(lines[0]["ids"], json!(["Ada", "Brun"]));
    assert_eq!(lines[0]["data"][0]["object"], "model");
    assert_eq!(lines[0]["data"][0]["owned_by"], "u1");
    assert!(lines[0]["data"][0]["created"].as_i64().unwrap() > 0);
    assert_eq!(lines[1]["ids"], json!(["Cass"]), "u2 sees only u2's");
    // Picked by name and by id: each turn ran for its character.
    for (line, sid, ch) in [(&lines[2], "s-ada", ada), (&lines[3], "s-brun", brun)] {
        let c = &line["completion"];
        let turns = turns_of(&pool, sid).await;
        assert_eq!(turns.len(), 1, "{sid}: {line}");
        assert_eq!(turns[0].0, ch, "{sid} runs its character");
        assert_eq!(c["choices"][0]["message"]["content"], json!(turns[0].1));
    }
    // Unknown: 404 with the caller's models, and never another user's character.
    for (line, user, listed) in [
        (&lines[4], "u1", json!(["Ada", "Brun"])),
        (&lines[5], "u2", json!(["Cass"])),
        (&lines[6], "u1", json!(["Ada", "Brun"])),
        (&lines[7], "u1", json!(["Ada", "Brun"])),
    ] {
        assert_eq!(line["status"], 404, "{line}");
        let e = error_of(line);
        assert_eq!(e["models"], listed, "{user}: {line}");
        let names = listed.as_array().unwrap();
        let said: Vec<&str> = names.iter().map(|n| n.as_str().unwrap()).collect();
        let msg = e["message"].as_str().unwrap();
        assert!(msg.contains(&said.join(", ")), "{msg}");
    }
    for sid in ["s-zed", "s-u2", "s-cass"] {
        assert!(
            turns_of(&pool, sid).await.is_empty(),
            "{sid} queued nothing"
        );
    }
    // A name two of the user's characters share lists each under `name#id`, and picks by it.
    let brun2 = character(&pool, "u1", "Brun").await;
    let listed: Value = reqwest::get(format!("{}/v1/models?user=u1", api.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "Ada".to_string(),
            format!("Brun#{brun}"),
            format!("Brun#{brun2}")
        ]
    );
}

/// With `http.system_message = persona`, the system message is the character's persona:
/// the first turn's prompt holds it, a changed one reaches the next turn (its snapshot,
/// made under the old persona, is refused and rebuilt), and another user's request cannot
/// change it.
#[sqlx::test(migrations = false)]
async fn a_system_message_becomes_the_persona_and_reaches_the_next_turn(pool: PgPool) {
    migrate(&pool).await;
    let ada = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(
        json!({"kv_dir": dir.path(), "n_ctx": 1024, "reply_max_tokens": 4,
                            "http_system_message": "persona"}),
    );
    let engine = load_engine(&smollm2(), &s);
    let api = api(&pool, s, "w-persona").await;
    let ask = |system: &str, text: &str| {
        let mut call = chat("u1", "Ada", "s-p", text, json!({}));
        call["kw"]["messages"] = json!([{"role": "system", "content": system},
                                        {"role": "user", "content": text}]);
        call
    };
    let first = "Zorblax keeps the lighthouse on Mars.";
    let second = "Quenta bakes bread in Lyon.";
    let base_of = |segs: Vec<(kvmem::snapshot::Segment, String)>| segs[0].1.clone();

    let lines = sdk(&api.base, &[ask(first, "Who are you?")]).await;
    assert!(lines[0]["completion"].is_object(), "{}", lines[0]);
    let base = base_of(kv_segments(&pool, &engine, "s-p").await);
    assert!(base.contains(first), "{base}");

    let lines = sdk(&api.base, &[ask(second, "And now?")]).await;
    let id = lines[0]["completion"]["kvmem"]["turn_id"].as_i64().unwrap();
    let base = base_of(kv_segments(&pool, &engine, "s-p").await);
    assert!(base.contains(second) && !base.contains(first), "{base}");
    let log = last_log(&pool, id).await;
    assert!(
        log.cold_reason
            .as_deref()
            .is_some_and(|r| r.contains("base prompt changed")),
        "{:?}",
        log.cold_reason
    );

    // u2 naming u1's character by id: refused, and u1's persona stays.
    let mut foreign = ask("u2 was here.", "Hi.");
    foreign["kw"]["user"] = json!("u2");
    foreign["kw"]["model"] = json!(ada.to_string());
    foreign["kw"]["extra_body"] = json!({"session_id": "s-u2", "character_id": ada});
    let lines = sdk(&api.base, &[foreign]).await;
    assert_eq!(lines[0]["status"], 404, "{}", lines[0]);
    assert_eq!(persona(&pool, ada).await, second);
}

async fn persona(pool: &PgPool, ch: i64) -> String {
    sqlx::query_scalar("SELECT persona FROM user_characters WHERE id = $1")
        .bind(ch)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// By default a system message changes nothing (the turn is queued, the persona stays);
/// `/v1/models` without a user lists only public characters. No worker runs.
#[sqlx::test(migrations = false)]
async fn the_system_message_is_ignored_by_default(pool: PgPool) {
    migrate(&pool).await;
    let ada = character(&pool, "u1", "Ada").await;
    let s = settings(json!({}));
    let state = crate::common::http_state(pool.clone(), Arc::new(s), "ab".repeat(32));
    let api = serve(state, None).await;
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{}/v1/chat/completions", api.base))
        .header("x-timeout-ms", "1")
        .json(&json!({"model": "Ada", "user": "u1", "session_id": "s-d",
                      "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                   {"role": "user", "content": "Hi."}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504, "queued, not run: no worker");
    assert_eq!(turns_of(&pool, "s-d").await.len(), 1);
    assert_eq!(persona(&pool, ada).await, "A veteran pilot.");
    let r = client
        .get(format!("{}/v1/models", api.base))
        .send()
        .await
        .unwrap();
    // No user: the public characters only (a front-end's connection check); Ada is u1's own.
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["data"], json!([]), "{body}");
}
