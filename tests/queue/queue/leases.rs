//! Leases, fencing, retries and bad input.

use super::*;
use kvmem::queue::{ClaimedTurn, TurnId};

/// One turn ("hello" in session s) on a fresh schema, claimed by worker A with a lease of
/// `lease_ms`.
async fn hello_claimed_by_a(pool: &PgPool, lease_ms: u64) -> (TurnId, ClaimedTurn) {
    migrate(pool).await;
    let ch = character(pool, "u1", "Ada").await;
    let id = queue::enqueue(pool, "s", "u1", ch, "hello", None)
        .await
        .unwrap();
    let lanes = vec!["live".to_string()];
    let claimed = queue::claim(pool, "A", lease_ms, &lanes)
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(claimed.id, id);
    (id, claimed)
}

#[sqlx::test(migrations = false)]
async fn expired_lease_is_rerun_by_another_worker_and_the_stale_one_is_fenced(pool: PgPool) {
    // Worker A claims with a 100 ms lease and then "hangs" (never heartbeats).
    let (id, stale) = hello_claimed_by_a(&pool, 100).await;
    let lanes = vec!["live".to_string()];
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
    let (id, stale) = hello_claimed_by_a(&pool, 50).await;
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
    deps.generator = std::sync::Arc::new(kvmem::runner::Echo {
        delay: Duration::from_millis(400),
    });
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
