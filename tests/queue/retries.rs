//! A chat request repeated without an `Idempotency-Key`: the turn its first attempt queued
//! while that turn is queued or running, or ended with its answer undelivered, or when the
//! client says it retries (within the retry window); a new turn once the answer was
//! delivered; and never another user's turn. The echo generator, driven with `drain`; the
//! OpenAI SDK's own retries on SmolLM2 are in `tests/models/retry.rs`.

use crate::common;

use std::sync::Arc;

use common::*;
use kvmem::runner::Outcome;
use serde_json::{json, Value};
use sqlx::PgPool;

/// The HTTP API without a worker: turns stay queued until the test drains them.
async fn api(pool: &PgPool, overrides: Value) -> Served {
    let state =
        crate::common::http_state(pool.clone(), Arc::new(settings(overrides)), "ab".repeat(32));
    serve(state, None).await
}

/// One chat request, as its bytes, with who asks in the headers.
struct Ask {
    url: String,
    user: &'static str,
    character: i64,
    body: String,
}

impl Ask {
    fn new(served: &Served, user: &'static str, character: i64, session: &str) -> Ask {
        let body = json!({"session_id": session,
                          "messages": [{"role": "user", "content": "Status report?"}]});
        Ask {
            url: format!("{}/v1/chat/completions", served.base),
            user,
            character,
            body: body.to_string(),
        }
    }

    /// Sends it, as the SDK's attempt `retry` when given; returns the status, the turn it
    /// answered for, and `x-should-retry`.
    async fn send(&self, retry: Option<u32>) -> (u16, i64, Option<String>) {
        let mut r = reqwest::Client::new()
            .post(&self.url)
            .header("content-type", "application/json")
            .header("x-user-id", self.user)
            .header("x-character-id", self.character.to_string())
            // No worker runs while a turn is queued: answer 504 quickly.
            .header("x-timeout-ms", "200")
            .body(self.body.clone());
        if let Some(n) = retry {
            r = r.header("x-stainless-retry-count", n.to_string());
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let retry = r
            .headers()
            .get("x-should-retry")
            .map(|v| v.to_str().unwrap().to_string());
        let body: Value = r.json().await.unwrap();
        let turn = body["kvmem"]["turn_id"]
            .as_i64()
            .or_else(|| body["error"]["turn_id"].as_i64())
            .unwrap_or(-1);
        (status, turn, retry)
    }
}

async fn turns(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_repeat_is_its_turn_until_the_answer_was_delivered(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let served = api(&pool, json!({})).await;
    let deps = echo_deps(&pool, settings(json!({})), "w");
    let ask = Ask::new(&served, "u1", ch, "s1");
    let timeout = || (504, Some("false".to_string()));

    // Queued: a repeat, retry header or not, is the same turn.
    let (status, t1, retry) = ask.send(None).await;
    assert_eq!((status, retry), timeout());
    assert_eq!(ask.send(None).await, (504, t1, Some("false".into())));
    assert_eq!(ask.send(Some(1)).await, (504, t1, Some("false".into())));
    assert_eq!(turns(&pool).await, 1);
    assert_eq!(
        drain(&deps).await,
        vec![Outcome::Done(kvmem::queue::TurnId(t1))]
    );

    // Done, its answer never delivered (every request timed out): the repeat gets it.
    assert_eq!(ask.send(None).await, (200, t1, None));
    // Delivered: the same request sent again on purpose is a new turn.
    let (status, t2, _) = ask.send(None).await;
    assert_eq!(status, 504);
    assert_ne!(t2, t1);
    assert_eq!(drain(&deps).await.len(), 1);
    assert_eq!(
        ask.send(Some(0)).await,
        (200, t2, None),
        "attempt 0 is no retry"
    );
    // A retry of a delivered answer (the client never got it) is still that turn...
    assert_eq!(ask.send(Some(2)).await, (200, t2, None));
    // ... but a first attempt after it is a new turn.
    let (status, t3, _) = ask.send(Some(0)).await;
    assert_eq!(status, 504);
    assert!(t3 > t2);
    assert_eq!(turns(&pool).await, 3);

    // Past the retry window an ended turn is no one's retry: with a window of 0, only a
    // queued turn is.
    let closed = api(&pool, json!({"http_retry_window_ms": 0})).await;
    let ask = Ask::new(&closed, "u1", ch, "s1");
    assert_eq!(ask.send(Some(1)).await.1, t3, "queued");
    assert_eq!(drain(&deps).await.len(), 1);
    let (status, t4, _) = ask.send(Some(1)).await;
    assert_eq!(status, 504);
    assert!(t4 > t3, "a retry after the window is a new turn");
    let replies: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM messages WHERE session_id = 's1' AND role = 'assistant'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(replies, 3, "one reply per turn that ran: t1, t2, t3");
}

/// The same bytes from another user (who it is comes in the headers) never reach the
/// first user's turn: in the first user's session they are refused, in their own session
/// they are their own turn.
#[sqlx::test(migrations = false)]
async fn a_repeat_never_reaches_another_users_turn(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let other = character(&pool, "u2", "Bob").await;
    let served = api(&pool, json!({})).await;
    let deps = echo_deps(&pool, settings(json!({})), "w");
    let mine = Ask::new(&served, "u1", ch, "s1");
    let (_, t1, _) = mine.send(None).await;
    let theirs = Ask::new(&served, "u2", other, "s1");
    assert_eq!(theirs.body, mine.body, "the same bytes");
    for retry in [None, Some(1)] {
        let (status, turn, should) = theirs.send(retry).await;
        assert_eq!((status, should.as_deref()), (400, Some("false")));
        assert_ne!(turn, t1);
    }
    assert_eq!(drain(&deps).await.len(), 1);
    let (status, turn, _) = theirs.send(Some(1)).await;
    assert_eq!((status, turn), (400, -1), "still refused once t1 is done");
    let own = Ask::new(&served, "u2", other, "s2");
    let (status, t2, _) = own.send(None).await;
    assert_eq!(status, 504);
    assert_ne!(t2, t1);
    let owners: Vec<(i64, String)> = sqlx::query_as("SELECT id, user_id FROM turns ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(owners, vec![(t1, "u1".into()), (t2, "u2".into())]);
}
