//! Public characters: set up once by an operator (`kvmem character add --public`), listed
//! to every user of a front-end (`GET /v1/models` with or without a user), talked to by a
//! user never seen before through the official OpenAI Python SDK with no kvmem field, and
//! walled per user: two users of one public character never see each other's dialogue or
//! memory (SQL, HTTP, memory search, summaries), and one user's erase of it leaves the
//! other's. Users manage their own characters over `/v1/characters`. Turns run on the echo
//! generator (queue mechanics); the interfaces are the real ones.

use crate::common;

use std::sync::Arc;

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;

const A_WORD: &str = "zarnokite";
const B_WORD: &str = "quillfern";

async fn api(pool: &PgPool, dir: &std::path::Path) -> Served {
    let s = settings(json!({"kv_dir": dir}));
    let config = kvmem::memory::MemoryConfig::from_settings(&s).unwrap();
    let memory = kvmem::system::memory_service_on(pool.clone(), config, None);
    let store = kvmem::system::snapshot_store(&s, &kvmem::metrics::Metrics::new()).unwrap();
    let state = crate::common::http_state(pool.clone(), Arc::new(s.clone()), "ab".repeat(32))
        .with_memory(Arc::new(memory))
        .with_snapshots(store);
    serve(state, Some(echo_deps(pool, s, "w-public"))).await
}

/// Lists the models as a front-end does, with `user` or without.
async fn models(base: &str, user: Option<&str>) -> Vec<String> {
    let mut req = reqwest::Client::new().get(format!("{base}/v1/models"));
    if let Some(u) = user {
        req = req.query(&[("user", u)]);
    }
    let v: Value = req.send().await.unwrap().json().await.unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

/// Says `text` to the model `model` as `user`, with no session: kvmem finds or starts one.
async fn say(base: &str, user: &str, model: &str, text: &str) -> Value {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": model, "user": user,
                      "messages": [{"role": "user", "content": text}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

const SDK_SCRIPT: &str = r#"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="unused")
names = [m.id for m in client.models.list()]
r = client.chat.completions.create(model="Guide", user="newcomer",
    messages=[{"role": "user", "content": "Hello, who are you?"}])
print(json.dumps({"models": names, "reply": r.choices[0].message.content}))
"#;

#[sqlx::test(migrations = false)]
async fn a_public_character_is_everyones_and_each_users_memory_is_their_own(pool: PgPool) {
    migrate(&pool).await;
    let url = db_url(&pool).await;
    let out = kvmem_command(&url)
        .args(["character", "add", "--name", "Guide", "--public"])
        .args(["--persona", "A patient museum guide."])
        .output()
        .unwrap();
    assert_success(&out);
    let guide: i64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alices_own = character(&pool, "alice", "Guide").await;
    let dir = tempfile::tempdir().unwrap();
    let server = api(&pool, dir.path()).await;

    // The list: public ones for anyone; a user's own beside them, each name unambiguous.
    assert_eq!(models(&server.base, None).await, ["Guide"]);
    assert_eq!(models(&server.base, Some("bob")).await, ["Guide"]);
    assert_eq!(
        models(&server.base, Some("alice")).await,
        [format!("Guide#{guide}"), format!("Guide#{alices_own}")]
    );

    // A user never seen before, through the SDK, with no kvmem field and no SQL first.
    let out = tokio::process::Command::new(openai_python())
        .args(["-c", SDK_SCRIPT, &format!("{}/v1", server.base)])
        .output()
        .await
        .unwrap();
    assert_success(&out);
    let sdk: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sdk["models"], json!(["Guide"]));
    assert_eq!(sdk["reply"], "echo: Hello, who are you?");

    // Two users talk to it; each gets their own session.
    let a = say(
        &server.base,
        "alice",
        &format!("Guide#{guide}"),
        &format!("My cat is {A_WORD}."),
    )
    .await;
    let b = say(
        &server.base,
        "bob",
        "Guide",
        &format!("My dog is {B_WORD}."),
    )
    .await;
    let session_of = |v: &Value| -> i64 { v["kvmem"]["turn_id"].as_i64().unwrap() };
    let sessions: Vec<(String, String)> =
        sqlx::query_as("SELECT user_id, session_id FROM turns WHERE character_id = $1 ORDER BY id")
            .bind(guide)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(sessions.len(), 3, "{sessions:?}");
    assert_ne!(
        sessions[1].1, sessions[2].1,
        "alice and bob share no session"
    );
    assert!(session_of(&a) < session_of(&b));

    // SQL: bob cannot queue into alice's session with it.
    let err = kvmem::queue::enqueue(&pool, &sessions[1].1, "bob", guide, "hi", None)
        .await
        .unwrap_err()
        .to_string();
    assert!(!err.contains(A_WORD), "{err}");
    assert!(err.contains("belongs to another user"), "{err}");

    // Memory: each finds their own word, never the other's.
    let search = |user: &str, q: &str| {
        reqwest::Client::new()
            .get(format!("{}/v1/memory/search", server.base))
            .query(&[("user", user), ("q", q), ("character", &guide.to_string())])
            .send()
    };
    // The hits, not the answer (which repeats the query).
    let hits = |v: Value| v["hits"].to_string();
    let mine = hits(search("alice", A_WORD).await.unwrap().json().await.unwrap());
    assert!(mine.contains(A_WORD), "{mine}");
    let theirs = hits(search("bob", A_WORD).await.unwrap().json().await.unwrap());
    assert!(!theirs.contains(A_WORD), "bob finds alice's word: {theirs}");
    let theirs = hits(search("alice", B_WORD).await.unwrap().json().await.unwrap());
    assert!(!theirs.contains(B_WORD), "alice finds bob's word: {theirs}");
    for (user, other) in [("alice", B_WORD), ("bob", A_WORD)] {
        let r = reqwest::Client::new()
            .get(format!("{}/v1/memory/summary", server.base))
            .query(&[("user", user), ("character", &guide.to_string())])
            .send()
            .await
            .unwrap();
        let text = r.text().await.unwrap();
        assert!(
            !text.contains(other),
            "{user}'s summary holds the other's word: {text}"
        );
    }

    // Bob forgets his part of it: his rows go, alice's and the character stay.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/erase", server.base))
        .json(&json!({"user": "bob", "character_id": guide}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let done: Value = r.json().await.unwrap();
    assert_eq!(done["kind"], "user_character", "{done}");
    let left = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        left("SELECT count(*) FROM turns WHERE user_id = 'bob'").await,
        0
    );
    assert_eq!(
        left("SELECT count(*) FROM memory_messages WHERE user_id = 'bob'").await,
        0
    );
    assert_eq!(
        left("SELECT count(*) FROM turns WHERE user_id = 'alice'").await,
        1
    );
    assert_eq!(
        left("SELECT count(*) FROM turns WHERE user_id = 'newcomer'").await,
        1
    );
    assert_eq!(
        models(&server.base, None).await,
        ["Guide"],
        "the character stays"
    );

    // The operator removes it: every user's data with it goes.
    let out = kvmem_command(&url)
        .env("KVMEM_KV_DIR", dir.path())
        .args(["character", "remove", &guide.to_string()])
        .output()
        .unwrap();
    assert_success(&out);
    assert_eq!(left("SELECT count(*) FROM turns").await, 0);
    assert_eq!(
        left("SELECT count(*) FROM memory_messages WHERE text LIKE '%zarnokite%'").await,
        0
    );
    assert!(models(&server.base, None).await.is_empty());
    assert_eq!(
        models(&server.base, Some("alice")).await,
        ["Guide"],
        "alice's own character stays"
    );
}

#[sqlx::test(migrations = false)]
async fn users_manage_their_own_characters_and_no_one_elses(pool: PgPool) {
    migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let server = api(&pool, dir.path()).await;
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}/v1/characters{path}", server.base);

    let r = client
        .post(url(""))
        .json(&json!({"user": "bob", "name": "Mine", "persona": "Bob's own sidekick."}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let mine: Value = r.json().await.unwrap();
    let id = mine["id"].as_i64().unwrap();
    assert_eq!(mine["public"], false);

    // Alice neither sees nor changes it; each refusal reads like a missing character.
    let listed: Value = client
        .get(url(""))
        .query(&[("user", "alice")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["data"], json!([]));
    for req in [
        client
            .get(url(&format!("/{id}")))
            .query(&[("user", "alice")]),
        client
            .patch(url(&format!("/{id}")))
            .json(&json!({"user": "alice", "persona": "hijacked"})),
        client
            .delete(url(&format!("/{id}")))
            .query(&[("user", "alice")]),
    ] {
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 404);
        assert!(!r.text().await.unwrap().contains("sidekick"));
    }
    let persona: String = sqlx::query_scalar("SELECT persona FROM user_characters WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(persona, "Bob's own sidekick.");

    // Bob edits it; making it public is an operator's choice, refused.
    let r = client
        .patch(url(&format!("/{id}")))
        .json(&json!({"user": "bob", "persona": "Bob's loyal sidekick."}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client
        .patch(url(&format!("/{id}")))
        .json(&json!({"user": "bob", "public": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let public: bool = sqlx::query_scalar("SELECT public FROM user_characters WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(!public);

    // Bob removes it, and what he said to it goes too.
    say(&server.base, "bob", "Mine", "remember the blue door").await;
    let r = client
        .delete(url(&format!("/{id}")))
        .query(&[("user", "bob")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM turns WHERE user_id = 'bob'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
    assert!(models(&server.base, Some("bob")).await.is_empty());
}
