//! Tenants are walls: user B, with B's own valid credentials, tries every entry point (the
//! SQL API, the HTTP API, the CLI) against user A's session, turn, idempotency key and
//! character. Every attempt gets a clear refusal, and none of A's data (A's message, A's
//! reply, A's session id where B did not name it) appears in anything B gets back.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use kvmem::queue;
use serde_json::{json, Value};
use sqlx::PgPool;

const A_SECRET: &str = "A's secret: the vault code is 7319";
const A_SESSION: &str = "sess_alice_private";

struct Fixture {
    a_char: i64,
    b_char: i64,
    a_turn: i64,
    a_reply: String,
}

/// A has one done turn (echo generator: queue mechanics only) with an idempotency key.
async fn fixture(pool: &PgPool) -> Fixture {
    migrate(pool).await;
    let a_char = character(pool, "alice", "Ada").await;
    let b_char = character(pool, "bob", "Bo").await;
    let a_turn = queue::enqueue(pool, A_SESSION, "alice", a_char, A_SECRET, Some("key-1"))
        .await
        .unwrap();
    drain(&echo_deps(pool, settings(json!({})), "w-a")).await;
    let a_reply: String = sqlx::query_scalar("SELECT reply FROM turns WHERE id = $1")
        .bind(a_turn.0)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(
        a_reply.contains(A_SECRET),
        "fixture: echo reply carries the secret"
    );
    Fixture {
        a_char,
        b_char,
        a_turn: a_turn.0,
        a_reply,
    }
}

fn assert_no_leak(what: &str, text: &str, f: &Fixture) {
    assert!(
        !text.contains("7319") && !text.contains(&f.a_reply),
        "{what} leaks A's data: {text}"
    );
}

#[sqlx::test(migrations = false)]
async fn sql_api_refuses_b_everywhere_and_tells_b_nothing_of_a(pool: PgPool) {
    let f = fixture(&pool).await;

    // A's session under B's own character: refused, nothing queued.
    let err = queue::enqueue(&pool, A_SESSION, "bob", f.b_char, "hi", None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("belongs to another user or character"),
        "{err}"
    );
    assert_no_leak("session refusal", &err, &f);

    // A's session with A's key: still refused (ownership is checked before the key), and
    // never answered with A's turn.
    let err = queue::enqueue(&pool, A_SESSION, "bob", f.b_char, "hi", Some("key-1"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("belongs to another user or character"),
        "{err}"
    );

    // A's key on B's own session: a new turn of B's, not an alias of A's.
    let b_turn = queue::enqueue(&pool, "sess_bob", "bob", f.b_char, "mine", Some("key-1"))
        .await
        .unwrap();
    assert_ne!(b_turn.0, f.a_turn);
    let owner: String = sqlx::query_scalar("SELECT user_id FROM turns WHERE id = $1")
        .bind(b_turn.0)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(owner, "bob");

    // B reusing that key on another of B's sessions: refused without naming any session.
    let err = queue::enqueue(&pool, "sess_bob_2", "bob", f.b_char, "x", Some("key-1"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("already used for another session"), "{err}");
    assert!(
        !err.contains("sess_bob") && !err.contains(A_SESSION),
        "{err}"
    );

    // A's character: reported exactly like a character that does not exist.
    let foreign = queue::enqueue(&pool, "sess_bob_3", "bob", f.a_char, "x", None)
        .await
        .unwrap_err()
        .to_string();
    let missing = queue::enqueue(&pool, "sess_bob_3", "bob", 999_999, "x", None)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        foreign.replace(&f.a_char.to_string(), "N"),
        missing.replace("999999", "N")
    );

    let a_turns: i64 = sqlx::query_scalar("SELECT count(*) FROM turns WHERE session_id = $1")
        .bind(A_SESSION)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(a_turns, 1, "nothing of B's entered A's session");
}

async fn api(pool: &PgPool, settings: kvmem::config::Settings, worker: bool) -> Served {
    let worker = worker.then(|| echo_deps(pool, settings.clone(), "w-http"));
    // Lexical memory (no embedder): enough to find A's words, and to prove B cannot.
    let config = kvmem::memory::MemoryConfig::from_settings(&settings).unwrap();
    let memory = kvmem::system::memory_service_on(pool.clone(), config, None);
    let state = crate::common::http_state(pool.clone(), Arc::new(settings), "ab".repeat(32))
        .with_memory(Arc::new(memory));
    serve(state, worker).await
}

fn chat(session: &str, user: &str, character: i64, text: &str) -> Value {
    json!({
        "session_id": session, "user": user, "character_id": character,
        "messages": [{"role": "user", "content": text}],
    })
}

#[sqlx::test(migrations = false)]
async fn http_api_refuses_b_everywhere_and_tells_b_nothing_of_a(pool: PgPool) {
    let f = fixture(&pool).await;
    let server = api(&pool, settings(json!({})), true).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", server.base);

    // B posting into A's session.
    let r = client
        .post(&url)
        .json(&chat(A_SESSION, "bob", f.b_char, "what did she say?"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_no_leak("chat into A's session", &r.text().await.unwrap(), &f);

    // B replaying A's idempotency key on A's session and on B's own.
    let r = client
        .post(&url)
        .header("Idempotency-Key", "key-1")
        .json(&chat(A_SESSION, "bob", f.b_char, "again"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_no_leak("A's key on A's session", &r.text().await.unwrap(), &f);
    let r = client
        .post(&url)
        .header("Idempotency-Key", "key-1")
        .json(&chat("sess_bob", "bob", f.b_char, "my own question"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_no_leak("A's key on B's session", &body.to_string(), &f);
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "echo: my own question"
    );
    assert_ne!(body["kvmem"]["turn_id"], json!(f.a_turn));

    // Streamed, the same walls: B's stream into A's session is refused before any event,
    // and A's idempotency key, which B used on B's own session above, streams B's turn.
    let streamed = |session: &str, text: &str| {
        let mut ask = chat(session, "bob", f.b_char, text);
        ask["stream"] = json!(true);
        ask
    };
    let r = client
        .post(&url)
        .json(&streamed(A_SESSION, "stream me her reply"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_no_leak("stream into A's session", &r.text().await.unwrap(), &f);
    let r = client
        .post(&url)
        .header("Idempotency-Key", "key-1")
        .json(&streamed("sess_bob", "my own question"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert_no_leak("A's key, streamed", &text, &f);
    assert!(text.contains("echo: my own question"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");

    // B with A's character.
    let r = client
        .post(&url)
        .json(&chat("sess_bob_2", "bob", f.a_char, "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // rotate-hint: A's session asked by B answers exactly like a session that does not exist.
    let hint = |sid: &str| {
        client
            .get(format!("{}/v1/rotate-hint?sid={sid}", server.base))
            .header("X-User-Id", "bob")
            .send()
    };
    let foreign = hint(A_SESSION).await.unwrap();
    assert_eq!(foreign.status(), 404);
    let foreign = foreign.text().await.unwrap();
    let missing = hint("no_such_session").await.unwrap().text().await.unwrap();
    assert_eq!(
        foreign.replace(A_SESSION, "S"),
        missing.replace("no_such_session", "S")
    );
    let own = client
        .get(format!("{}/v1/rotate-hint?sid={A_SESSION}", server.base))
        .header("X-User-Id", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), 200, "A still reads A's own hint");

    // Memory search, snapshot and refresh as B never show A's dialogue; as A they do.
    let search = |user: &str| {
        client
            .get(format!(
                "{}/v1/memory/search?user={user}&q=vault%20code&limit=10",
                server.base
            ))
            .send()
    };
    let mine: Value = search("alice").await.unwrap().json().await.unwrap();
    assert!(
        mine.to_string().contains("7319"),
        "A finds A's own words: {mine}"
    );
    let r = search("bob").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_no_leak("memory search as B", &r.text().await.unwrap(), &f);
    let r = client
        .get(format!("{}/v1/memory?user=bob", server.base))
        .send()
        .await
        .unwrap();
    assert_no_leak("memory snapshot as B", &r.text().await.unwrap(), &f);
    let r = client
        .post(format!("{}/v1/memory/refresh?user=bob", server.base))
        .send()
        .await
        .unwrap();
    assert_no_leak("memory refresh as B", &r.text().await.unwrap(), &f);
}

#[sqlx::test(migrations = false)]
async fn http_api_needs_the_token_and_bounds_requests(pool: PgPool) {
    let f = fixture(&pool).await;
    let s = settings(json!({
        "http_token": "s3cret-token", "http_max_body_bytes": 4096,
        "http_max_in_flight": 1, "http_max_timeout_ms": 2000,
    }));
    // No worker: turns stay queued, so a request waits for its (capped) timeout.
    let server = api(&pool, s, false).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", server.base);
    let body = chat("sess_bob", "bob", f.b_char, "hello");

    let r = client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 401, "no token");
    let r = client
        .post(&url)
        .bearer_auth("s3cret-tokeX")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "wrong token");
    let r = client
        .get(format!("{}/v1/info", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "every route is behind the token");
    let info: Value = client
        .get(format!("{}/v1/info", server.base))
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        !info.to_string().contains("s3cret-token"),
        "/v1/info never shows the token: {info}"
    );

    // X-Timeout-Ms is capped at http_max_timeout_ms (2000), and must be a number.
    let started = std::time::Instant::now();
    let r = client
        .post(&url)
        .bearer_auth("s3cret-token")
        .header("X-Timeout-Ms", "3600000")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    assert!(r.text().await.unwrap().contains("within 2000 ms"));
    assert!(started.elapsed() < Duration::from_secs(60));
    let r = client
        .post(&url)
        .bearer_auth("s3cret-token")
        .header("X-Timeout-Ms", "soon")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    // Bodies over http_max_body_bytes are refused.
    let big = chat("sess_bob", "bob", f.b_char, &"x".repeat(8000));
    let r = client
        .post(&url)
        .bearer_auth("s3cret-token")
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);

    // One request in flight at most: a second one while the first waits gets 503.
    let queued_turns = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM turns WHERE session_id = 'sess_bob'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    // The requests above queued turns too: the slow one is in flight once there is one more.
    // (Another message: the same request again would be the retry of the queued turn.)
    let before = queued_turns().await;
    let slow = {
        let body = chat("sess_bob", "bob", f.b_char, "hello again");
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            client
                .post(&url)
                .bearer_auth("s3cret-token")
                .header("X-Timeout-Ms", "2000")
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if queued_turns().await > before {
            break;
        }
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = client
        .get(format!("{}/v1/info", server.base))
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(slow.await.unwrap(), 504);
}

#[sqlx::test(migrations = false)]
async fn cli_refuses_b_and_serve_guards_itself(pool: PgPool) {
    let f = fixture(&pool).await;
    let url = db_url(&pool).await;

    let out = kvmem_command(&url)
        .args(["enqueue", "--session", A_SESSION, "--user", "bob"])
        .args(["--character", &f.b_char.to_string(), "--message", "hi"])
        .args(["--idempotency-key", "key-1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("belongs to another user or character"),
        "{err}"
    );
    assert_no_leak("CLI enqueue", &err, &f);
    assert_no_leak(
        "CLI enqueue stdout",
        &String::from_utf8_lossy(&out.stdout),
        &f,
    );

    // Beyond loopback without a token, serve refuses to start.
    let out = kvmem_command(&url)
        .args(["serve", "--listen", "0.0.0.0:0", "--no-worker"])
        .env_remove("KVMEM_HTTP_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("without KVMEM_HTTP_TOKEN"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A server whose in-process worker died exits non-zero instead of answering 504 forever.
    let mut child = kvmem_command(&url)
        .args(["serve", "--listen", "127.0.0.1:0", "--generator", "echo"])
        .env("KVMEM_TEST_PANIC_AT", "fetch_loop")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve kept running after its worker died");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("worker"), "{err}");
}

#[sqlx::test(migrations = false)]
async fn todos_are_walled_by_user_and_character(pool: PgPool) {
    let f = fixture(&pool).await;
    let url = db_url(&pool).await;
    let at = chrono::Utc::now();
    let made = kvmem::memory::notes::todos::apply(
        &pool,
        "alice",
        f.a_char,
        "turn:1:user",
        "I'll open the vault with code 7319 tomorrow",
        at,
    )
    .await
    .unwrap();
    assert_eq!(made.created.len(), 1, "{made:?}");

    // B saying the closing words, even naming A's character, closes nothing of A's.
    let b_closes = kvmem::memory::notes::todos::apply(
        &pool,
        "bob",
        f.a_char,
        "turn:9:user",
        "I opened the vault with code 7319",
        at,
    )
    .await
    .unwrap();
    assert!(b_closes.closed.is_empty(), "{b_closes:?}");
    let status: String = sqlx::query_scalar("SELECT status FROM todos WHERE id = $1")
        .bind(made.created[0])
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "open");

    // HTTP: A reads A's own todo; B with A's character or B's own gets an empty list.
    let server = api(&pool, settings(json!({})), false).await;
    let client = reqwest::Client::new();
    let get = |user: &str, ch: i64| {
        client
            .get(format!(
                "{}/v1/memory/todos?user={user}&character={ch}&all=true",
                server.base
            ))
            .send()
    };
    let mine: Value = get("alice", f.a_char).await.unwrap().json().await.unwrap();
    assert!(
        mine.to_string().contains("7319"),
        "A reads A's todo: {mine}"
    );
    for ch in [f.a_char, f.b_char] {
        let r = get("bob", ch).await.unwrap();
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        assert_no_leak("todos over HTTP as B", &body.to_string(), &f);
        assert_eq!(body["todos"], json!([]), "{body}");
    }

    // CLI: the same wall.
    let cli = |user: &str, ch: i64| {
        kvmem_command(&url)
            .args([
                "memory",
                "todos",
                "--user",
                user,
                "--character",
                &ch.to_string(),
            ])
            .args(["--all", "--json"])
            .output()
            .unwrap()
    };
    let out = cli("alice", f.a_char);
    assert_success(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("7319"));
    let out = cli("bob", f.a_char);
    assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_no_leak("todos CLI as B", &stdout, &f);
    assert_eq!(stdout.trim(), "[]");
}
