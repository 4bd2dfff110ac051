//! Bounded, typed input, and an erase that stays done without undoing anything newer: a
//! request's history past each import limit, a message past its own, an id or key past the
//! index bound, a stop string too long, and a seed written `7.0` are refused where the user
//! sees it (400 over HTTP, 22023 in SQL) with nothing queued; a late lane job's cleanup
//! keeps the data of a user id used again after its erase; a worker's sweep removes a
//! snapshot written before its scope's erase and keeps one written after, and sweeps each
//! scope once; the audit subject is keyed, not a plain hash.

use crate::common;

use std::sync::Arc;

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;

async fn turns(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn input_past_a_bound_is_refused_where_the_caller_sees_it(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u-b", "Ada").await;
    let s = settings(
        json!({"http_max_history_messages": 4, "http_max_history_chars": 150,
                            "http_max_message_chars": 100}),
    );
    let server = serve(
        crate::common::http_state(pool.clone(), Arc::new(s), "ab".repeat(32)),
        None,
    )
    .await;
    let client = reqwest::Client::new();
    let post = |body: Value, headers: Vec<(&'static str, String)>| {
        let mut req = client
            .post(format!("{}/v1/chat/completions", server.base))
            .header("x-timeout-ms", "1");
        for (k, v) in headers {
            req = req.header(k, v);
        }
        req.json(&body).send()
    };
    let exchange = |i: usize, len: usize| {
        vec![
            json!({"role": "user", "content": format!("q{i} {}", "x".repeat(len))}),
            json!({"role": "assistant", "content": format!("a{i}")}),
        ]
    };
    let with_history = |pairs: Vec<Vec<Value>>| {
        let mut messages: Vec<Value> = pairs.into_iter().flatten().collect();
        messages.push(json!({"role": "user", "content": "and now?"}));
        json!({"user": "u-b", "character_id": ch, "messages": messages})
    };
    // (what, body, headers, what the refusal names)
    type Case = (
        &'static str,
        Value,
        Vec<(&'static str, String)>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "messages",
            with_history((0..3).map(|i| exchange(i, 1)).collect()),
            vec![],
            "http.max_history_messages",
        ),
        (
            "characters",
            with_history(vec![exchange(0, 80), exchange(1, 80)]),
            vec![],
            "http.max_history_chars",
        ),
        (
            "one message",
            json!({"user": "u-b", "character_id": ch, "session_id": "s-b",
                   "messages": [{"role": "user", "content": "y".repeat(101)}]}),
            vec![],
            "http.max_message_chars",
        ),
        (
            "a long session id",
            json!({"user": "u-b", "character_id": ch, "session_id": "s".repeat(3000),
                   "messages": [{"role": "user", "content": "hi"}]}),
            vec![],
            "session_id is 3000 bytes",
        ),
        (
            "a long key",
            json!({"user": "u-b", "character_id": ch, "session_id": "s-b",
                   "messages": [{"role": "user", "content": "hi"}]}),
            vec![("idempotency-key", "k".repeat(3000))],
            "Idempotency-Key is 3000 bytes",
        ),
        (
            "a long stop string",
            json!({"user": "u-b", "character_id": ch, "session_id": "s-b", "stop": ["z".repeat(65)],
                   "messages": [{"role": "user", "content": "hi"}]}),
            vec![],
            "64 characters",
        ),
        (
            "a seed written 7.0",
            json!({"user": "u-b", "character_id": ch, "session_id": "s-b", "seed": 7.0,
                   "messages": [{"role": "user", "content": "hi"}]}),
            vec![],
            "seed",
        ),
    ];
    for (what, body, headers, names) in cases {
        let r = post(body, headers).await.unwrap();
        assert_eq!(r.status(), 400, "{what}");
        let text = r.text().await.unwrap();
        assert!(text.contains(names), "{what}: {text}");
        assert_eq!(turns(&pool).await, 0, "{what}: nothing queued");
    }
    // Within the bounds the same history is imported and the turn queued.
    let r = post(with_history(vec![exchange(0, 1), exchange(1, 1)]), vec![])
        .await
        .unwrap();
    assert_eq!(r.status(), 504, "queued, no worker to run it");
    assert_eq!(turns(&pool).await, 3);

    // The SQL API types the options as the worker reads them.
    for options in [
        json!({"seed": 7.0}),
        json!({"max_tokens": 5.0}),
        json!({"stop": ["z".repeat(65)]}),
    ] {
        let err = sqlx::query("SELECT kvmem_check_turn_options($1)")
            .bind(&options)
            .execute(&pool)
            .await
            .unwrap_err();
        let code = err
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.to_string());
        assert_eq!(code.as_deref(), Some("22023"), "{options}: {err}");
    }
    let ok: Value = sqlx::query_scalar("SELECT kvmem_check_turn_options($1)")
        .bind(json!({"seed": 7, "stop": ["END"]}))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(ok["seed"], 7);
}

#[sqlx::test(migrations = false)]
async fn a_late_job_cleans_up_only_what_came_of_the_erased_data(pool: PgPool) {
    migrate(&pool).await;
    let old = character(&pool, "u-reused", "Ada").await;
    kvmem::queue::enqueue(
        &pool,
        "s-old",
        "u-reused",
        old,
        "the old secret is 1111",
        None,
    )
    .await
    .unwrap();
    drain(&echo_deps(&pool, settings(json!({})), "w-old")).await;
    sqlx::query("SELECT kvmem_erase_user('u-reused')")
        .execute(&pool)
        .await
        .unwrap();
    // The id is used again: a new account, a new character, a new chat.
    let new = character(&pool, "u-reused", "Bo").await;
    kvmem::queue::enqueue(
        &pool,
        "s-new",
        "u-reused",
        new,
        "the new plan is 2222",
        None,
    )
    .await
    .unwrap();
    drain(&echo_deps(&pool, settings(json!({})), "w-new")).await;
    // A lane job that ran through the erase writes what it derived from the old chat.
    let old_turn: i64 = 999_999;
    sqlx::query(
        "INSERT INTO memories (user_id, kind, fact_type, text, source_message_ids, memory_key, source)
         VALUES ('u-reused', 'PROFILE', 'other', 'old secret 1111', $1, 'k-old', 'extraction'),
                ('u-reused', 'PROFILE', 'other', 'new plan 2222',
                 ARRAY(SELECT message_id FROM memory_messages WHERE user_id = 'u-reused' LIMIT 1),
                 'k-new', 'extraction')",
    )
    .bind(vec![format!("turn:{old_turn}:user")])
    .execute(&pool)
    .await
    .unwrap();
    let done: i32 = sqlx::query_scalar("SELECT kvmem_erase_late('u-reused', $1, 600)")
        .bind(old)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(done, 1, "the erase was recent: the late job cleans up");
    let texts: Vec<String> =
        sqlx::query_scalar("SELECT text FROM memories WHERE user_id = 'u-reused' ORDER BY text")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        texts,
        ["new plan 2222"],
        "the old derivation goes, the new stays"
    );
    let new_turns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM turns WHERE user_id = 'u-reused' AND session_id = 's-new'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(new_turns, 1, "the new account's chat stays");
    let new_char: i64 = sqlx::query_scalar("SELECT count(*) FROM user_characters WHERE id = $1")
        .bind(new)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(new_char, 1);

    // The audit subject is keyed: not the plain SHA-256 of the id.
    let (subject, plain): (String, String) = sqlx::query_as(
        "SELECT detail->>'subject', 'user:' || encode(sha256('u-reused'), 'hex')
           FROM events WHERE kind = 'erased'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        subject.starts_with("user:") && subject != plain,
        "{subject}"
    );
}

#[sqlx::test(migrations = false)]
async fn the_sweep_removes_what_was_written_before_an_erase_and_sweeps_each_scope_once(
    pool: PgPool,
) {
    migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let store = kvmem::system::snapshot_store(
        &settings(json!({"kv_dir": dir.path()})),
        &kvmem::metrics::Metrics::new(),
    )
    .unwrap();
    let (stale, reused) = ("a".repeat(32), "b".repeat(32));
    std::fs::write(store.files().path(&stale), b"before").unwrap();
    sqlx::query("INSERT INTO erased_scopes (scope) VALUES ($1), ($2)")
        .bind(&stale)
        .bind(&reused)
        .execute(&pool)
        .await
        .unwrap();
    // The session id of `reused` is used again after its erase: its new snapshot.
    let erased_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT max(erased_at) FROM erased_scopes")
            .fetch_one(&pool)
            .await
            .unwrap();
    // File times are kept at the kernel's clock tick, coarser than Postgres' microseconds:
    // the new snapshot is written a clear 50 ms after the erase.
    while chrono::Utc::now() <= erased_at + chrono::Duration::milliseconds(50) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    std::fs::write(store.files().path(&reused), b"after").unwrap();
    let keep = std::time::Duration::from_secs(3600);
    let mut mark = kvmem::erase::SweepMark::default();
    let first = kvmem::erase::sweep(&pool, &store, keep, &mut mark)
        .await
        .unwrap();
    assert_eq!((first.scopes, first.removed.files), (2, 1));
    assert!(!store.files().path(&stale).exists());
    assert!(
        store.files().path(&reused).exists(),
        "the newer snapshot stays"
    );
    let again = kvmem::erase::sweep(&pool, &store, keep, &mut mark)
        .await
        .unwrap();
    assert_eq!(again.scopes, 0, "each scope is swept once per worker");
}
