//! Queue mechanics against a real Postgres, with the echo generator (a labelled fake: these
//! tests are about claiming, ordering, leases and fencing, not about generation).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use kvmem::queue::{self, QueueError};
use kvmem::runner::{process_next_turn, Outcome};
use sqlx::{PgPool, Row};
use tokio_util::sync::CancellationToken;

#[sqlx::test(migrations = false)]
async fn many_workers_keep_every_session_in_order(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let (sessions, turns) = (50, 20);
    // Enqueue round-robin so sessions interleave in id order.
    for t in 0..turns {
        for s in 0..sessions {
            queue::enqueue(
                &pool,
                &format!("s{s}"),
                "u1",
                ch,
                &format!("turn {t}"),
                None,
            )
            .await
            .unwrap();
        }
    }
    let mut workers = Vec::new();
    for w in 0..4 {
        let deps = echo_deps(&pool, settings(serde_json::json!({})), &format!("w{w}"));
        workers.push(tokio::spawn(async move {
            let never = CancellationToken::new();
            let mut idle = 0;
            while idle < 20 {
                match process_next_turn(&deps, &never).await.unwrap() {
                    Outcome::Empty => {
                        idle += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Outcome::Done(_) => idle = 0,
                    other => panic!("unexpected outcome {other:?}"),
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    assert_every_turn_ran_once_in_order(&pool, sessions * turns).await;
    let workers_used: i64 = sqlx::query_scalar("SELECT count(DISTINCT worker_id) FROM turn_log")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        workers_used >= 2,
        "only {workers_used} worker did all the work"
    );
}

/// Every turn done, one run and one reply each, and per session: runs in id order with
/// no overlap (`turn_log` timestamps).
async fn assert_every_turn_ran_once_in_order(pool: &PgPool, total: usize) {
    let not_done: i64 = sqlx::query_scalar("SELECT count(*) FROM turns WHERE state <> 'done'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(not_done, 0);
    let runs: Vec<(i64, i64)> =
        sqlx::query_as("SELECT turn_id, count(*) FROM turn_log GROUP BY turn_id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(runs.len(), total);
    assert!(runs.iter().all(|(_, n)| *n == 1), "a turn ran twice");
    let replies: i64 = sqlx::query_scalar("SELECT count(*) FROM messages WHERE role = 'assistant'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(replies, total as i64);
    // Order: within a session, start times follow ids, and no two runs overlap.
    let rows = sqlx::query(
        "SELECT l.sid, l.turn_id, l.started_at, l.finished_at FROM turn_log l ORDER BY l.sid, l.started_at",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut last: HashMap<String, (i64, chrono::DateTime<chrono::Utc>)> = HashMap::new();
    let mut violations = 0;
    for r in rows {
        let sid: String = r.get("sid");
        let id: i64 = r.get("turn_id");
        let started: chrono::DateTime<chrono::Utc> = r.get("started_at");
        let finished: chrono::DateTime<chrono::Utc> = r.get("finished_at");
        if let Some((prev_id, prev_finish)) = last.get(&sid) {
            if *prev_id > id || *prev_finish > started {
                violations += 1;
            }
        }
        last.insert(sid, (id, finished));
    }
    assert_eq!(violations, 0, "order or overlap violations");
}

/// The worker loop as deployed: batched claims with a prefetch beyond the free slots, and
/// group commits. Same guarantees as one-at-a-time.
#[sqlx::test(migrations = false)]
async fn batched_claims_and_group_commits_keep_every_session_in_order(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let (sessions, turns) = (60, 15);
    sqlx::query(
        "SELECT kvmem_enqueue_turn('s' || s, 'u1', $1, 'turn ' || t)
           FROM generate_series(1, $3) t, generate_series(1, $2) s ORDER BY t, s",
    )
    .bind(ch)
    .bind(sessions as i32)
    .bind(turns as i32)
    .execute(&pool)
    .await
    .unwrap();
    let shutdown = CancellationToken::new();
    let url = db_url(&pool).await;
    let mut workers = Vec::new();
    for w in 0..3 {
        // A pool per worker, as in separate processes: each holds two LISTEN connections.
        let own = sqlx::postgres::PgPoolOptions::new()
            .max_connections(6)
            .connect(&url)
            .await
            .unwrap();
        let deps = echo_deps(
            &own,
            settings(
                serde_json::json!({"concurrency": 3, "claim_batch": 25, "complete_batch": 16, "poll_ms": 50}),
            ),
            &format!("w{w}"),
        );
        workers.push(tokio::spawn(kvmem::runner::run(deps, shutdown.clone())));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM turns WHERE state <> 'done'")
            .fetch_one(&pool)
            .await
            .unwrap();
        if left == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{left} turns left");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    for w in workers {
        w.await.unwrap().expect("worker");
    }
    assert_every_turn_ran_once_in_order(&pool, sessions * turns).await;
    let free: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM session_locks WHERE turn_id IS NULL AND head_turn_id IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        free, sessions as i64,
        "every session ends free with no head"
    );
    // The batches really were batches: some claims took several turns at once.
    let widest: i64 = sqlx::query_scalar(
        "SELECT max(n) FROM (SELECT count(*) AS n FROM events WHERE kind = 'claimed'
                              GROUP BY created_at, detail->>'worker') c",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(widest > 3, "no claim took more than {widest} turns");
}

/// A group commit fences each turn on its own: the one whose lease was taken writes
/// nothing, the others commit and their sessions move to their next turn.
#[sqlx::test(migrations = false)]
async fn group_commit_fences_each_turn(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    for sid in ["a", "b", "c"] {
        queue::enqueue(&pool, sid, "u1", ch, &format!("hi {sid}"), None)
            .await
            .unwrap();
    }
    let next_a = queue::enqueue(&pool, "a", "u1", ch, "again", None)
        .await
        .unwrap();
    let lanes = vec!["live".to_string()];
    let mut claimed = queue::claim_up_to(&pool, "w1", 30_000, &lanes, 10)
        .await
        .unwrap();
    claimed.sort_by(|x, y| x.session_id.cmp(&y.session_id));
    assert_eq!(
        claimed
            .iter()
            .map(|t| t.session_id.as_str())
            .collect::<Vec<_>>(),
        ["a", "b", "c"],
        "one turn per session"
    );
    // Another worker took b's lease (as after a reap and a reclaim).
    sqlx::query("UPDATE session_locks SET fencing_token = fencing_token + 1, owner = 'w2' WHERE session_id = 'b'")
        .execute(&pool)
        .await
        .unwrap();
    let batch: Vec<queue::Completion> = claimed
        .iter()
        .map(|t| queue::Completion {
            turn: t.clone(),
            output: echo_output(&format!("reply {}", t.session_id), &t.session_id),
        })
        .collect();
    let results = queue::complete_many(&pool, &batch).await.unwrap();
    assert!(results[0].is_ok() && results[2].is_ok());
    assert!(matches!(results[1], Err(QueueError::Fenced(id)) if id == claimed[1].id));
    let states: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT session_id, state::text, reply FROM turns WHERE id = ANY($1) ORDER BY session_id",
    )
    .bind(claimed.iter().map(|t| t.id.0).collect::<Vec<_>>())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        states,
        [
            ("a".into(), "done".into(), Some("reply a".into())),
            ("b".into(), "running".into(), None),
            ("c".into(), "done".into(), Some("reply c".into())),
        ]
    );
    let messages: Vec<(String, String, String)> =
        sqlx::query_as("SELECT session_id, role, content FROM messages ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        messages,
        [
            ("a".into(), "user".into(), "hi a".into()),
            ("a".into(), "assistant".into(), "reply a".into()),
            ("c".into(), "user".into(), "hi c".into()),
            ("c".into(), "assistant".into(), "reply c".into()),
        ]
    );
    let logs: Vec<String> = sqlx::query_scalar("SELECT sid FROM turn_log ORDER BY sid")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(logs, ["a", "c"]);
    // (session, running turn, owner, head turn)
    type Lock = (String, Option<i64>, Option<String>, Option<i64>);
    let locks: Vec<Lock> = sqlx::query_as(
        "SELECT session_id, turn_id, owner, head_turn_id FROM session_locks ORDER BY session_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        locks,
        [
            ("a".into(), None, None, Some(next_a.0)),
            // b is still running under w2: its head stays on the running turn.
            (
                "b".into(),
                Some(claimed[1].id.0),
                Some("w2".into()),
                Some(claimed[1].id.0)
            ),
            ("c".into(), None, None, None),
        ]
    );
}

#[sqlx::test(migrations = false)]
async fn enqueue_is_idempotent(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let a = queue::enqueue(&pool, "s", "u1", ch, "hello", Some("req-1"))
        .await
        .unwrap();
    let b = queue::enqueue(&pool, "s", "u1", ch, "hello", Some("req-1"))
        .await
        .unwrap();
    let c = queue::enqueue(&pool, "s", "u1", ch, "hello", Some("req-2"))
        .await
        .unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Concurrent calls with one key still give one turn.
    let mut handles = Vec::new();
    for _ in 0..8 {
        let pool = pool.clone();
        handles.push(tokio::spawn(async move {
            queue::enqueue(&pool, "s", "u1", ch, "again", Some("req-3"))
                .await
                .unwrap()
        }));
    }
    let mut ids = Vec::new();
    for h in handles {
        ids.push(h.await.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 3);
    // The same key from another session is an error, not a silent alias.
    let err = queue::enqueue(&pool, "other", "u1", ch, "hello", Some("req-1"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already used"), "{err}");
}

#[sqlx::test(migrations = false)]
async fn expired_lease_is_rerun_by_another_worker_and_the_stale_one_is_fenced(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let id = queue::enqueue(&pool, "s", "u1", ch, "hello", None)
        .await
        .unwrap();
    let lanes = vec!["live".to_string()];
    // Worker A claims with a 100 ms lease and then "hangs" (never heartbeats).
    let stale = queue::claim(&pool, "A", 100, &lanes)
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(stale.id, id);
    // While A's lease is live, nobody else can take the session.
    assert!(queue::claim(&pool, "B", 100, &lanes)
        .await
        .unwrap()
        .is_none());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let reaped = queue::reap(&pool).await.unwrap();
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].turn_id, id);
    // Worker B re-runs it.
    let deps = echo_deps(&pool, settings(serde_json::json!({})), "B");
    assert_eq!(drain(&deps).await, vec![Outcome::Done(id)]);
    // A wakes up and tries to complete: refused by the fencing token.
    let err = queue::complete(&pool, &stale, echo_output("stale reply", "s"))
        .await
        .unwrap_err();
    assert!(matches!(err, QueueError::Fenced(t) if t == id));
    let (reply, attempts): (String, i32) =
        sqlx::query_as("SELECT reply, attempts FROM turns WHERE id = $1")
            .bind(id.0)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(reply, "echo: hello");
    assert_eq!(attempts, 2, "the reaped attempt counts");
    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM events WHERE turn_id = $1 ORDER BY id")
            .bind(id.0)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(kinds, ["claimed", "reaped", "claimed", "completed"]);
    let assistant: i64 =
        sqlx::query_scalar("SELECT count(*) FROM messages WHERE role = 'assistant'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(assistant, 1);
}

#[sqlx::test(migrations = false)]
async fn stale_worker_cannot_complete_even_before_anyone_reclaims(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let id = queue::enqueue(&pool, "s", "u1", ch, "hello", None)
        .await
        .unwrap();
    let lanes = vec!["live".to_string()];
    let stale = queue::claim(&pool, "A", 50, &lanes).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    queue::reap(&pool).await.unwrap();
    assert!(matches!(
        queue::complete(&pool, &stale, echo_output("late", "s")).await,
        Err(QueueError::Fenced(_))
    ));
    assert!(!queue::heartbeat(&pool, &stale, 1000).await.unwrap());
    let state: String = sqlx::query_scalar("SELECT state::text FROM turns WHERE id = $1")
        .bind(id.0)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, "queued");
}

#[sqlx::test(migrations = false)]
async fn retries_back_off_then_die_and_the_session_moves_on(pool: PgPool) {
    migrate(&pool).await;
    sqlx::query("UPDATE kvmem_config SET value = '3' WHERE key = 'max_attempts'")
        .execute(&pool)
        .await
        .unwrap();
    let ch = character(&pool, "u1", "Ada").await;
    let bad = queue::enqueue(&pool, "s", "u1", ch, "echo-fail:boom", None)
        .await
        .unwrap();
    let next = queue::enqueue(&pool, "s", "u1", ch, "after", None)
        .await
        .unwrap();
    let deps = echo_deps(
        &pool,
        settings(serde_json::json!({"backoff_base_ms": 100, "backoff_max_ms": 1000})),
        "w",
    );
    let never = CancellationToken::new();
    let mut outcomes = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !outcomes.contains(&Outcome::Done(next)) {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out: {outcomes:?}"
        );
        match process_next_turn(&deps, &never).await.unwrap() {
            // Backoff is real time; wait for the next run_at.
            Outcome::Empty => tokio::time::sleep(Duration::from_millis(20)).await,
            o => outcomes.push(o),
        }
    }
    assert_eq!(
        outcomes,
        vec![
            Outcome::Retrying(bad),
            Outcome::Retrying(bad),
            Outcome::Dead(bad),
            Outcome::Done(next)
        ],
        "the later turn must wait behind the retried head, then run"
    );
    let (state, attempts, error): (String, i32, String) =
        sqlx::query_as("SELECT state::text, attempts, error FROM turns WHERE id = $1")
            .bind(bad.0)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempts), ("dead", 3));
    assert!(error.contains("boom"));
    // Backoff grows: gaps between attempts are at least 100 ms, then 200 ms.
    let starts: Vec<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT started_at FROM turn_log WHERE turn_id = $1 ORDER BY attempt")
            .bind(bad.0)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(starts.len(), 3);
    let gap1 = (starts[1] - starts[0]).num_milliseconds();
    let gap2 = (starts[2] - starts[1]).num_milliseconds();
    assert!(gap1 >= 100 && gap2 >= 200, "gaps {gap1} ms, {gap2} ms");
    let statuses: Vec<String> =
        sqlx::query_scalar("SELECT status FROM turn_log WHERE turn_id = $1")
            .bind(bad.0)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(statuses.iter().all(|s| s == "ERROR"));
}

async fn enqueue_err(pool: &PgPool, sid: &str, user: &str, ch: i64, msg: &str) -> (String, String) {
    let err = sqlx::query_scalar::<_, i64>("SELECT kvmem_enqueue_turn($1, $2, $3, $4)")
        .bind(sid)
        .bind(user)
        .bind(ch)
        .bind(msg)
        .fetch_one(pool)
        .await
        .expect_err("bad input must be refused");
    let db = err.as_database_error().expect("a database error");
    (
        db.code().unwrap_or_default().to_string(),
        db.message().to_string(),
    )
}

#[sqlx::test(migrations = false)]
async fn bad_input_is_refused_with_a_clear_error(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let other = character(&pool, "u2", "Bob").await;
    let long = "x".repeat(8001);
    let cases: Vec<(&str, &str, i64, &str, &str, &str)> = vec![
        ("s", "u1", ch, "", "22023", "message must not be empty"),
        ("s", "u1", ch, "   ", "22023", "message must not be empty"),
        ("s", "u1", ch, &long, "22023", "over the limit of 8000"),
        ("", "u1", ch, "hi", "22023", "session_id must not be blank"),
        (
            "  ",
            "u1",
            ch,
            "hi",
            "22023",
            "session_id must not be blank",
        ),
        (
            "s",
            "u1",
            999_999,
            "hi",
            "P0002",
            "unknown character 999999",
        ),
        ("s", "u1", other, "hi", "P0002", "unknown character"),
        (
            "s",
            "u1",
            ch,
            "bell \u{7} here",
            "22023",
            "control characters",
        ),
        ("s", "", ch, "hi", "22023", "user_id must not be blank"),
    ];
    for (sid, user, c, msg, code, text) in cases {
        let (got_code, got) = enqueue_err(&pool, sid, user, c, msg).await;
        assert_eq!(got_code, code, "{got}");
        assert!(got.contains(text), "expected {text:?} in {got:?}");
    }
    // NUL bytes cannot even reach the function: Postgres text refuses them.
    let (code, msg) = enqueue_err(&pool, "s", "u1", ch, "nul\0byte").await;
    assert_eq!(code, "22021", "{msg}");
    // A session belongs to its first user and character.
    queue::enqueue(&pool, "shared", "u1", ch, "hi", None)
        .await
        .unwrap();
    let (code, msg) = enqueue_err(&pool, "shared", "u2", other, "hi").await;
    assert_eq!(code, "22023");
    assert!(msg.contains("belongs to another user"), "{msg}");
    // SQL-looking text is only data.
    let id = queue::enqueue(&pool, "s2", "u1", ch, "'); DROP TABLE turns; --", None)
        .await
        .unwrap();
    let stored: String = sqlx::query_scalar("SELECT message FROM turns WHERE id = $1")
        .bind(id.0)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, "'); DROP TABLE turns; --");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 2, "only the two good turns were queued");
}

#[sqlx::test(migrations = false)]
async fn completion_is_announced_on_the_done_channel(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    listener.listen(queue::TURN_DONE_CHANNEL).await.unwrap();
    let id = queue::enqueue(&pool, "s", "u1", ch, "hello", None)
        .await
        .unwrap();
    let deps = echo_deps(&pool, settings(serde_json::json!({})), "w");
    drain(&deps).await;
    let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .unwrap()
        .unwrap();
    let payload: serde_json::Value = serde_json::from_str(n.payload()).unwrap();
    assert_eq!(payload["turn_id"], id.0);
    assert_eq!(payload["state"], "done");
}

#[sqlx::test(migrations = false)]
async fn shutdown_releases_a_turn_without_counting_it(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let id = queue::enqueue(&pool, "s", "u1", ch, "slow", None)
        .await
        .unwrap();
    let mut deps = echo_deps(
        &pool,
        settings(serde_json::json!({"shutdown_grace_ms": 50})),
        "w",
    );
    deps.generator = kvmem::runner::generator::Generator::Echo {
        delay: Duration::from_millis(400),
    };
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    let outcome = process_next_turn(&deps, &shutdown).await.unwrap();
    assert_eq!(outcome, Outcome::Released(id));
    let (state, attempts): (String, i32) =
        sqlx::query_as("SELECT state::text, attempts FROM turns WHERE id = $1")
            .bind(id.0)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempts), ("queued", 0));
    let deps = echo_deps(&pool, settings(serde_json::json!({})), "w2");
    assert_eq!(drain(&deps).await, vec![Outcome::Done(id)]);
}

#[sqlx::test(migrations = false)]
async fn status_report_shows_the_queue(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    queue::enqueue(&pool, "s", "u1", ch, "one", None)
        .await
        .unwrap();
    queue::enqueue(&pool, "s", "u1", ch, "two", None)
        .await
        .unwrap();
    let text = kvmem::cmd::status::report(&pool).await.unwrap();
    assert!(text.contains("queued   2"), "{text}");
    assert!(text.contains("live"), "{text}");
}

#[sqlx::test(migrations = false)]
async fn old_events_are_trimmed(pool: PgPool) {
    migrate(&pool).await;
    sqlx::query("INSERT INTO events (kind, created_at) VALUES ('old', now() - interval '200 hours'), ('new', now())")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(queue::trim_events(&pool, 168).await.unwrap(), 1);
    let left: Vec<String> = sqlx::query_scalar("SELECT kind FROM events")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, ["new"]);
}

/// A finished echo turn's output, as the generator hands it to the completion.
fn echo_output(reply: &str, sid: &str) -> kvmem::turn::TurnOutput {
    kvmem::turn::TurnOutput {
        reply: reply.to_string(),
        log: kvmem::turn::log::KvLog::start(kvmem::turn::log::TurnPath::Echo, sid, 4096),
        kv: None,
        memory_ops: Vec::new(),
    }
}
