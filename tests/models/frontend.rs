//! A chat front-end on SmolLM2 through the official OpenAI Python SDK: every request sends
//! the whole history and no id of kvmem's (`user`, and the character as `model`). A new chat
//! starts cold and its next message continues warm in the same session; regenerate gives a
//! second reply in a branch, which the next message continues; an edit branches, and the
//! reply's prompt holds the edited text and not the old; history never seen becomes a new
//! session's dialogue; and the match never crosses users or chats. (The rules, driven with
//! the echo generator, are in `tests/queue/conversations.rs`.)

use crate::common;

use std::sync::Arc;

use common::*;
use kvmem::engine::Engine;
use serde_json::{json, Value};
use sqlx::PgPool;

/// Runs a front-end's chats through the SDK and prints one JSON line per request: its
/// name, the session (`x-kvmem-session`), how it was found (`x-kvmem-conversation`), the
/// turn, the reply and the cached prompt tokens.
const SDK_SCRIPT: &str = r#"
import json, sys, openai
base, ch, ch2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = openai.OpenAI(base_url=base, api_key="unused")
SYSTEM = {"role": "system", "content": "You are Ada, a ship's pilot."}
# The model picker's list: each user's own characters, Ada among them.
for u in ("u1", "u2"):
    assert "Ada" in [m.id for m in client.models.list(extra_query={"user": u})], u
def ask(name, history, user="u1"):
    raw = client.chat.completions.with_raw_response.create(
        model="Ada", messages=[SYSTEM] + history, user=user)
    c = raw.parse()
    out = {"name": name, "session": raw.headers.get("x-kvmem-session"),
           "how": raw.headers.get("x-kvmem-conversation"), "turn": c.model_extra["kvmem"]["turn_id"],
           "reply": c.choices[0].message.content,
           "cached": c.usage.prompt_tokens_details.cached_tokens}
    print(json.dumps(out), flush=True)
    return out["reply"]
U = lambda t: {"role": "user", "content": t}
A = lambda t: {"role": "assistant", "content": t}
m1 = [U("My name is Tom.")]
r1 = ask("first", m1)
m2 = m1 + [A(r1), U("What is my name?")]
ask("second", m2)
r2b = ask("regenerate", m2)
ask("after", m2 + [A(r2b), U("Thanks, Ada.")])
ask("edit_second", m1 + [A(r1), U("Where do I live?")])
ask("edit_first", [U("My name is Zed.")])
ask("unseen", [U("I keep bees on the roof."), A("Bees! How many hives?"), U("Three hives.")])
ask("other_user", m2, user="u2")
rp = ask("other_chat", [U("Let us plan the landing.")])
ask("other_chat_next", [U("Let us plan the landing."), A(rp), U("Which runway?")])
"#;

/// A SmolLM2 worker and the HTTP API, as `kvmem serve` runs them, on a pool of their own.
async fn api(pool: &PgPool, engine: Arc<Engine>, s: kvmem::config::Settings) -> Served {
    let own = kvmem::system::connect_url(&db_url(pool).await, 16)
        .await
        .unwrap();
    let deps = llama_deps(&own, s.clone(), engine, "w-frontend");
    let state = crate::common::http_state(own, Arc::new(s), "ab".repeat(32));
    serve(state, Some(deps)).await
}

/// The dialogue in the KV after the session's last turn, as recorded: its exchange
/// segments, the prompt's dialogue and the reply. (Recall blocks are left out: long-term
/// memory spans the user's sessions with the character by design, so a recalled line of
/// another branch may be there.)
async fn recorded(pool: &PgPool, engine: &Engine, sid: &str) -> String {
    kv_segments(pool, engine, sid)
        .await
        .into_iter()
        .filter(|(seg, _)| seg.kind == kvmem::snapshot::SegKind::Turn)
        .map(|(_, text)| text)
        .collect()
}

/// The session's stored dialogue: (turn, message, reply) per done turn, in order.
async fn dialogue(pool: &PgPool, sid: &str) -> Vec<(i64, String, String)> {
    sqlx::query_as(
        "SELECT u.turn_id, u.content, a.content FROM messages u
           JOIN messages a ON a.turn_id = u.turn_id AND a.role = 'assistant'
          WHERE u.session_id = $1 AND u.role = 'user' ORDER BY u.turn_id",
    )
    .bind(sid)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn cold(pool: &PgPool, turn: i64) -> bool {
    sqlx::query_scalar("SELECT cold FROM turn_log WHERE turn_id = $1 AND status = 'OK'")
        .bind(turn)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_front_end_without_session_ids_continues_branches_and_starts_chats(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let ch2 = character(&pool, "u2", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(json!({"kv_dir": dir.path(), "n_ctx": 1024, "reply_max_tokens": 12}));
    let engine = load_engine(&smollm2(), &s);
    let api = api(&pool, engine.clone(), s).await;
    let out = tokio::process::Command::new(openai_python())
        .args(["-c", SDK_SCRIPT, &format!("{}/v1", api.base)])
        .args([ch.to_string(), ch2.to_string()])
        .output()
        .await
        .unwrap();
    assert_success(&out);
    let lines: std::collections::HashMap<String, Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["name"].as_str().unwrap().to_string(), v))
        .collect();
    let at = |name: &str| -> (String, String, i64, String, i64) {
        let v = &lines[name];
        (
            v["session"].as_str().unwrap().to_string(),
            v["how"].as_str().unwrap().to_string(),
            v["turn"].as_i64().unwrap(),
            v["reply"].as_str().unwrap().to_string(),
            v["cached"].as_i64().unwrap(),
        )
    };

    // A new chat starts cold; its second message continues warm, in the same session.
    let (a, how, t1, r1, cached) = at("first");
    assert_eq!((how.as_str(), cached), ("started", 0));
    assert!(cold(&pool, t1).await);
    let (s2, how, t2, _, cached) = at("second");
    assert_eq!((s2.as_str(), how.as_str()), (a.as_str(), "continued"));
    assert!(cached > 0 && !cold(&pool, t2).await, "cached {cached}");
    assert_eq!(dialogue(&pool, &a).await.len(), 2);

    // Regenerate: a second reply to the same message, in a branch holding the first
    // exchange; the next message continues the branch, after the regenerated reply.
    let (b, how, t2b, r2b, _) = at("regenerate");
    assert_eq!(how, "branched");
    assert_ne!((b.as_str(), t2b), (a.as_str(), t2));
    let (s3, how, t3, _, cached) = at("after");
    assert_eq!((s3.as_str(), how.as_str()), (b.as_str(), "continued"));
    assert!(cached > 0, "cached {cached}");
    let d = dialogue(&pool, &b).await;
    let shown: Vec<(&str, &str)> = d.iter().map(|(_, m, r)| (m.as_str(), r.as_str())).collect();
    assert_eq!(
        shown[..2],
        [
            ("My name is Tom.", r1.as_str()),
            ("What is my name?", r2b.as_str())
        ]
    );
    assert_eq!((d[1].0, d[2].0), (t2b, t3));
    assert_eq!(
        dialogue(&pool, &a).await.len(),
        2,
        "the old branch is as it was"
    );

    // An edit of the second message branches at the first exchange; of the first, starts
    // over. Each reply's recorded prompt holds the edited text and not the old.
    let (c, how, _, _, _) = at("edit_second");
    assert_eq!(how, "branched");
    let prompt = recorded(&pool, &engine, &c).await;
    assert!(prompt.contains("Where do I live?") && prompt.contains("My name is Tom."));
    assert!(!prompt.contains("What is my name?"), "{prompt}");
    let (z, how, _, _, _) = at("edit_first");
    assert_eq!(how, "started");
    let prompt = recorded(&pool, &engine, &z).await;
    assert!(
        prompt.contains("My name is Zed.") && !prompt.contains("Tom"),
        "{prompt}"
    );

    // History never seen is the new session's dialogue, and the first reply's prompt.
    let (u, how, _, _, _) = at("unseen");
    assert_eq!(how, "started");
    let d = dialogue(&pool, &u).await;
    assert_eq!(
        (d[0].1.as_str(), d[0].2.as_str()),
        ("I keep bees on the roof.", "Bees! How many hives?")
    );
    assert_eq!(d[1].1, "Three hives.");
    let prompt = recorded(&pool, &engine, &u).await;
    assert!(prompt.contains("Bees! How many hives?"), "{prompt}");

    // Another user sending u1's history, and u1's other chat, get sessions of their own.
    let (o, how, _, _, _) = at("other_user");
    assert_eq!(how, "started");
    let (p, how, _, _, _) = at("other_chat");
    assert_eq!(how, "started");
    let (p2, how, _, _, _) = at("other_chat_next");
    assert_eq!((p2.as_str(), how.as_str()), (p.as_str(), "continued"));
    let all = [&a, &b, &c, &z, &u, &o, &p];
    for (i, s) in all.iter().enumerate() {
        assert!(!all[i + 1..].contains(s), "{all:?}");
    }
    let owner: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT user_id FROM turns WHERE session_id = $1")
            .bind(&o)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(owner, vec!["u2".to_string()]);
}
