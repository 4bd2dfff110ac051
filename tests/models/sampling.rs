//! A chat request's sampling fields, honoured per request through the official OpenAI
//! Python SDK on SmolLM2: the same `seed` and `temperature` give the same reply twice and
//! another seed another reply; `max_tokens` cuts with "length"; `stop` cuts with "stop",
//! whole and streamed, and the stored dialogue and the KV end where the reply does. Fields
//! kvmem cannot honour are refused with a 400 naming them, and queue nothing; the SQL API
//! refuses bad options the same way.

use crate::characters::{api, chat, error_of, sdk};
use crate::common;

use std::sync::Arc;

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;

const ASK: &str = "Tell me about the sea.";

fn content(line: &Value) -> String {
    line["completion"]["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no completion: {line}"))
        .to_string()
}

fn finish(line: &Value) -> &str {
    line["completion"]["choices"][0]["finish_reason"]
        .as_str()
        .unwrap()
}

/// A word of `reply` to stop at: from its middle, not in the prompt's own words, and not
/// found earlier in the reply (so the reply up to it is what a stop there leaves).
fn stop_word(reply: &str) -> (String, usize) {
    let words: Vec<&str> = reply.split_whitespace().collect();
    words[words.len() / 2..]
        .iter()
        .map(|w| w.trim_matches(|c: char| !c.is_alphabetic()))
        .filter(|w| w.len() >= 4 && !ASK.contains(w) && !"assistant".contains(w))
        .find_map(|w| {
            let at = reply.find(w)?;
            (at > 0).then(|| (w.to_string(), at))
        })
        .unwrap_or_else(|| panic!("no word to stop at in {reply:?}"))
}

#[sqlx::test(migrations = false)]
async fn sampling_fields_are_honoured_per_request(pool: PgPool) {
    migrate(&pool).await;
    character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    // No recall and no context block: the sessions below share a user and a character,
    // and each must see the same prompt, so only the request's fields tell them apart.
    let s = settings(
        json!({"kv_dir": dir.path(), "n_ctx": 1024, "reply_max_tokens": 40,
                            "memory_max_tokens": 0, "summary_max_tokens": 0}),
    );
    let engine = load_engine(&smollm2(), &s);
    let api = api(&pool, s, "w-sampling").await;
    let warm = json!({"temperature": 1.2, "seed": 7});
    let lines = sdk(
        &api.base,
        &[
            chat("u1", "Ada", "s-a", ASK, warm.clone()),
            chat("u1", "Ada", "s-b", ASK, warm),
            chat(
                "u1",
                "Ada",
                "s-c",
                ASK,
                json!({"temperature": 1.2, "seed": 8}),
            ),
            chat("u1", "Ada", "s-d", ASK, json!({})),
            chat("u1", "Ada", "s-e", ASK, json!({"max_tokens": 3})),
        ],
    )
    .await;
    let (a, b, c, greedy) = (
        content(&lines[0]),
        content(&lines[1]),
        content(&lines[2]),
        content(&lines[3]),
    );
    assert!(!a.is_empty());
    assert_eq!(a, b, "the same seed and temperature, the same reply");
    assert_ne!(a, c, "another seed, another reply");
    assert_ne!(
        a, greedy,
        "temperature 1.2 samples away from the greedy reply"
    );
    assert_eq!(finish(&lines[4]), "length");
    let e = lines[4]["completion"]["kvmem"]["turn_id"].as_i64().unwrap();
    let (reason, r_tokens): (Option<String>, i32) = sqlx::query_as(
        "SELECT finish_reason, r_tokens FROM turn_log WHERE turn_id = $1 AND status = 'OK'",
    )
    .bind(e)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((reason.as_deref(), r_tokens), (Some("length"), 3));

    // Stop at a word of the greedy reply: the reply is what came before it.
    let (word, at) = stop_word(&greedy);
    let before = &greedy[..at];
    let stop = json!({"stop": [word.clone(), "zzqx"]});
    let mut streamed = chat("u1", "Ada", "s-g", ASK, stop.clone());
    streamed["stream"] = json!(true);
    let lines = sdk(&api.base, &[chat("u1", "Ada", "s-f", ASK, stop), streamed]).await;
    assert_eq!(content(&lines[0]), before, "cut at {word:?}");
    assert_eq!(finish(&lines[0]), "stop");
    let chunks = lines[1]["chunks"].as_array().unwrap();
    assert_eq!(sse_content(chunks), before, "streamed, cut at {word:?}");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    // The stored dialogue and the KV end where the reply does.
    let stored: String = sqlx::query_scalar(
        "SELECT content FROM messages WHERE session_id = 's-f' AND role = 'assistant'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored, before);
    let kv = kv_segments(&pool, &engine, "s-f").await;
    let exchange = &kv.iter().rev().nth(1).unwrap().1;
    assert!(
        exchange.contains(before.trim()) && !exchange.contains(&word),
        "{exchange:?}"
    );
}

#[sqlx::test(migrations = false)]
async fn fields_kvmem_cannot_honour_are_refused_by_name(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let state =
        crate::common::http_state(pool.clone(), Arc::new(settings(json!({}))), "ab".repeat(32));
    let api = serve(state, None).await;
    let refused = [
        ("n", json!({"n": 2})),
        (
            "tools",
            json!({"tools": [{"type": "function", "function": {"name": "f"}}]}),
        ),
        ("tool_choice", json!({"tool_choice": "auto"})),
        (
            "response_format",
            json!({"response_format": {"type": "json_object"}}),
        ),
        ("logprobs", json!({"logprobs": true})),
        ("temperature", json!({"temperature": 2.5})),
        ("stop", json!({"stop": [""]})),
    ];
    let calls: Vec<Value> = refused
        .iter()
        .map(|(_, more)| chat("u1", "Ada", "s", "Hi.", more.clone()))
        .collect();
    let lines = sdk(&api.base, &calls).await;
    for ((field, _), line) in refused.iter().zip(&lines) {
        assert_eq!(line["status"], 400, "{field}: {line}");
        let e = error_of(line);
        assert_eq!(e["param"], *field, "{line}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains(&format!("`{field}`")),
            "{line}"
        );
    }
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(queued, 0, "a refused request queues nothing");

    // The SQL API: bad options are refused with the key named; good ones travel on the turn.
    let enqueue = |options: Value| {
        sqlx::query_scalar::<_, i64>(
            "SELECT kvmem_enqueue_turn('s-sql', 'u1', $1, 'Hi.', options => $2)",
        )
        .bind(ch)
        .bind(options)
        .fetch_one(&pool)
    };
    for (bad, named) in [
        (json!({"temperature": 5}), "temperature"),
        (json!({"n": 2}), "unknown option n"),
        (json!({"seed": -3}), "seed"),
        (json!({"stop": "END"}), "stop"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!([1]), "object"),
    ] {
        let err = enqueue(bad.clone()).await.unwrap_err();
        let db = err.as_database_error().expect("a database error");
        assert_eq!(db.code().as_deref(), Some("22023"), "{bad}");
        assert!(db.message().contains(named), "{bad}: {}", db.message());
    }
    let good = json!({"temperature": 0.5, "top_p": 0.9, "seed": 1, "stop": ["X"], "max_tokens": 5});
    let id = enqueue(good.clone()).await.unwrap();
    let stored: Value = sqlx::query_scalar("SELECT options FROM turns WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, good);
}
