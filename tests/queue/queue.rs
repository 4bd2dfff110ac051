//! Queue mechanics against a real Postgres, with the echo generator (a labelled fake: these
//! tests are about claiming, ordering, leases and fencing, not about generation).

use crate::common;

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
        let own = kvmem::system::connect_url(&url, 6).await.unwrap();
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

/// A finished echo turn's output, as the generator hands it to the completion.
fn echo_output(reply: &str, sid: &str) -> kvmem::turn::TurnOutput {
    kvmem::turn::TurnOutput {
        reply: reply.to_string(),
        log: kvmem::turn::log::KvLog::start(kvmem::turn::log::TurnPath::Echo, sid, 4096),
        kv: None,
        memory_ops: Vec::new(),
    }
}

mod leases;
