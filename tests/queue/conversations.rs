//! Chat requests that name no session, as a front-end sends them (the whole history each
//! time): the history's chain hash continues its session, branches it at an earlier turn
//! (regenerate, edit) or starts a new one with the history as its dialogue; a retry is still
//! its turn; a conversation header names a session; and the match never crosses users,
//! characters or chats. The echo generator (the reply is `echo: <message>`) in a worker
//! served with the API; the same on SmolLM2 through the OpenAI SDK is in
//! `tests/models/frontend.rs`.

use crate::common;

use std::sync::Arc;

use common::*;
use kvmem::turn::chain;
use serde_json::{json, Value};
use sqlx::PgPool;

async fn api(pool: &PgPool) -> Served {
    let s = settings(json!({}));
    let deps = echo_deps(pool, s.clone(), "w-conversations");
    serve(
        crate::common::http_state(pool.clone(), Arc::new(s), "ab".repeat(32)),
        Some(deps),
    )
    .await
}

/// What one request got: its session, how it was found, the turn and the reply.
#[derive(Debug)]
struct Got {
    session: String,
    how: String,
    turn: i64,
    reply: String,
}

/// A chat's messages: alternating user and assistant texts, ending with a user's.
fn messages(texts: &[&str]) -> Value {
    let list: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": t})
        })
        .collect();
    Value::Array(list)
}

async fn ask(api: &Served, user: &str, ch: i64, texts: &[&str], extra: &[(&str, &str)]) -> Got {
    let (status, got) = try_ask(api, user, ch, texts, extra).await;
    assert_eq!(status, 200, "{got:?}");
    got.unwrap()
}

async fn try_ask(
    api: &Served,
    user: &str,
    ch: i64,
    texts: &[&str],
    extra: &[(&str, &str)],
) -> (u16, Option<Got>) {
    let body = json!({"model": "kvmem", "user": user, "character_id": ch,
                      "messages": messages(texts)});
    let mut r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", api.base))
        .json(&body);
    for (k, v) in extra {
        r = r.header(*k, *v);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let head = |k: &str| {
        r.headers()
            .get(k)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let (session, how) = (head("x-kvmem-session"), head("x-kvmem-conversation"));
    let body: Value = r.json().await.unwrap();
    if status != 200 {
        return (status, None);
    }
    assert_eq!(body["kvmem"]["session_id"], json!(session));
    let got = Got {
        session,
        how,
        turn: body["kvmem"]["turn_id"].as_i64().unwrap(),
        reply: body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
    };
    (status, Some(got))
}

/// A session's stored dialogue, in order: (message, reply) per done turn.
async fn dialogue(pool: &PgPool, sid: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT u.content, a.content FROM messages u
           JOIN messages a ON a.turn_id = u.turn_id AND a.role = 'assistant'
          WHERE u.session_id = $1 AND u.role = 'user' ORDER BY u.turn_id",
    )
    .bind(sid)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The chain hashes the completion and the copies stored for a session's done turns.
async fn stored_hashes(pool: &PgPool, sid: &str) -> Vec<Option<Vec<u8>>> {
    sqlx::query_scalar(
        "SELECT chain_hash FROM turns WHERE session_id = $1 AND state = 'done' ORDER BY id",
    )
    .bind(sid)
    .fetch_all(pool)
    .await
    .unwrap()
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(m, r)| (m.to_string(), r.to_string()))
        .collect()
}

#[sqlx::test(migrations = false)]
async fn the_sql_chain_hash_is_the_one_requests_are_hashed_with(pool: PgPool) {
    migrate(&pool).await;
    let one: Vec<u8> = sqlx::query_scalar("SELECT kvmem_chain_hash(NULL, E' Grüße\\n', 'ok ')")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(one, chain::next(None, "Grüße", "ok"));
    let two: Vec<u8> = sqlx::query_scalar("SELECT kvmem_chain_hash($1, 'a  b', E'c\\td')")
        .bind(&one)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(two, chain::next(Some(&one), "a  b", "c\td"));
    assert_ne!(two, chain::next(Some(&one), "a b", "c\td"));
}

/// A new chat, its next message, a regenerate of it, the message after the regenerated
/// reply, an edit of the second message and a retry of that edit.
#[sqlx::test(migrations = false)]
async fn a_chat_continues_and_regenerate_and_edit_branch_it(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let api = api(&pool).await;

    let first = ask(&api, "u1", ch, &["Hi"], &[]).await;
    assert_eq!(first.how, "started");
    let a = first.session.clone();
    let next = ask(&api, "u1", ch, &["Hi", &first.reply, "Next"], &[]).await;
    assert_eq!(
        (next.how.as_str(), next.session.as_str()),
        ("continued", a.as_str())
    );
    // The answer was delivered: the same request again is a regenerate, not a retry.
    let again = ask(&api, "u1", ch, &["Hi", &first.reply, "Next"], &[]).await;
    assert_eq!(again.how, "branched");
    assert_ne!(again.session, a);
    assert_ne!(again.turn, next.turn);
    let b = again.session.clone();
    let after = ask(
        &api,
        "u1",
        ch,
        &["Hi", &first.reply, "Next", &again.reply, "More"],
        &[],
    )
    .await;
    assert_eq!(
        (after.how.as_str(), after.session.as_str()),
        ("continued", b.as_str())
    );

    // The old branch is as it was; the new one has the first exchange, then its own.
    let echo = |m: &str| format!("echo: {m}");
    assert_eq!(
        dialogue(&pool, &a).await,
        pairs(&[("Hi", &echo("Hi")), ("Next", &echo("Next"))])
    );
    assert_eq!(
        dialogue(&pool, &b).await,
        pairs(&[
            ("Hi", &echo("Hi")),
            ("Next", &echo("Next")),
            ("More", &echo("More"))
        ])
    );
    for sid in [&a, &b] {
        let d = dialogue(&pool, sid).await;
        let want = chain::hashes(d.iter().map(|(m, r)| (m.as_str(), r.as_str())));
        let got: Vec<Vec<u8>> = stored_hashes(&pool, sid)
            .await
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(got, want, "session {sid}");
    }
    let origin: Vec<(Option<String>, Option<i64>)> =
        sqlx::query_as("SELECT origin, copied_from FROM turns WHERE session_id = $1 ORDER BY id")
            .bind(&b)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        origin,
        vec![
            (Some("branch".into()), Some(first.turn)),
            (None, None),
            (None, None)
        ]
    );
    // The copy is not a second memory of the first exchange.
    let remembered: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM memory_messages WHERE user_id = 'u1' AND text = 'Hi'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(remembered, 1);

    // An edit of the second message branches at the first exchange; the SDK's retry of
    // that request is its turn.
    let edit = ["Hi", &first.reply, "Edited"];
    let edited = ask(&api, "u1", ch, &edit, &[]).await;
    assert_eq!(edited.how, "branched");
    assert!(![&a, &b].contains(&&edited.session));
    let retried = ask(&api, "u1", ch, &edit, &[("x-stainless-retry-count", "1")]).await;
    assert_eq!(
        (retried.how.as_str(), retried.turn),
        ("repeat", edited.turn)
    );
    assert_eq!(
        dialogue(&pool, &edited.session).await,
        pairs(&[("Hi", &echo("Hi")), ("Edited", &echo("Edited"))])
    );
}

/// History never seen becomes the new session's dialogue, which the next request continues;
/// the match never reaches another user's, another character's or another chat's session.
#[sqlx::test(migrations = false)]
async fn the_match_is_walled_per_user_character_and_chat(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let ch2 = character(&pool, "u1", "Bea").await;
    let other = character(&pool, "u2", "Ada").await;
    let api = api(&pool).await;

    let p = ask(&api, "u1", ch, &["Chat P", "Welcome.", "Go on"], &[]).await;
    assert_eq!(p.how, "started");
    assert_eq!(
        dialogue(&pool, &p.session).await,
        pairs(&[("Chat P", "Welcome."), ("Go on", "echo: Go on")])
    );
    let q = ask(&api, "u1", ch, &["Chat Q"], &[]).await;
    assert_ne!(q.session, p.session);
    let p_history = ["Chat P", "Welcome.", "Go on", &p.reply, "P again"];
    let p2 = ask(&api, "u1", ch, &p_history, &[]).await;
    assert_eq!(
        (p2.how.as_str(), p2.session.as_str()),
        ("continued", p.session.as_str())
    );
    let q2 = ask(&api, "u1", ch, &["Chat Q", &q.reply, "Q again"], &[]).await;
    assert_eq!(
        (q2.how.as_str(), q2.session.as_str()),
        ("continued", q.session.as_str())
    );

    // The same history from another user, or with another character, is a chat of its own.
    let u2 = ask(&api, "u2", other, &p_history, &[]).await;
    assert_eq!(u2.how, "started");
    let bea = ask(&api, "u1", ch2, &p_history, &[]).await;
    assert_eq!(bea.how, "started");
    let sessions = [&p.session, &q.session, &u2.session, &bea.session];
    for (i, s) in sessions.iter().enumerate() {
        assert!(!sessions[i + 1..].contains(s), "{sessions:?}");
    }
    // Another user's character is unknown to the match, and nothing is queued or copied.
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(&pool)
        .await
        .unwrap();
    let (status, _) = try_ask(&api, "u2", ch, &p_history, &[]).await;
    assert_eq!(status, 404);
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(after, before);
    let owners: Vec<(String, i64)> =
        sqlx::query_as("SELECT DISTINCT user_id, character_id FROM turns WHERE session_id = $1")
            .bind(&u2.session)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(owners, vec![("u2".to_string(), other)]);
}

/// A conversation header names the session, whatever the history: it wins over the match,
/// and the same chat id of another user is another session.
#[sqlx::test(migrations = false)]
async fn a_conversation_header_names_the_session(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let other = character(&pool, "u2", "Ada").await;
    let api = api(&pool).await;
    let named = [("x-conversation-id", "chat-7")];

    let one = ask(&api, "u1", ch, &["Before", "Earlier reply.", "Now"], &named).await;
    assert_eq!(one.how, "named");
    assert_eq!(
        dialogue(&pool, &one.session).await,
        pairs(&[("Before", "Earlier reply."), ("Now", "echo: Now")])
    );
    // An edited history with the same chat id stays in the named session.
    let two = ask(&api, "u1", ch, &["Changed", "x", "Later"], &named).await;
    assert_eq!(
        (two.how.as_str(), two.session.as_str()),
        ("named", one.session.as_str())
    );
    assert_eq!(dialogue(&pool, &one.session).await.len(), 3);
    let theirs = ask(&api, "u2", other, &["Now"], &named).await;
    assert_ne!(theirs.session, one.session);
    // An explicit session id wins over the header.
    let body = json!({"user": "u1", "character_id": ch, "session_id": "s-own",
                      "messages": messages(&["Hello"])});
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", api.base))
        .header("x-conversation-id", "chat-7")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-kvmem-session"], "s-own");
    assert_eq!(r.headers()["x-kvmem-conversation"], "session");
}
