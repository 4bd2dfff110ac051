//! An erase and the turn path on the same session, interleaved on two connections each way
//! (a completion, an enqueue), neither fails the other nor leaves an orphan: the erase
//! takes the session's locks in the turn path's order. A request waiting on a turn that is
//! erased answers 404 with `x-should-retry: false`, and the official Python SDK at its
//! default retries does not queue the request, and its history, again.

use crate::common;

use std::sync::Arc;

use common::*;
use kvmem::queue;
use serde_json::{json, Value};
use sqlx::PgPool;

const S: &str = "s-race";
const USER: &str = "u-race";

/// Waits until another backend waits on a lock while running a statement containing
/// `needle`: the interleaving the test means to make, observed, not timed.
async fn blocked_on(pool: &PgPool, needle: &str) {
    for _ in 0..3000 {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE pid <> pg_backend_pid() AND wait_event_type = 'Lock'
                AND query LIKE '%' || $1 || '%'",
        )
        .bind(needle)
        .fetch_one(pool)
        .await
        .unwrap();
        if n > 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no statement with {needle:?} came to wait on a lock");
}

/// A running turn of `S`, claimed as a worker claims it: (turn id, fencing token).
async fn running_turn(pool: &PgPool) -> (i64, i64) {
    migrate(pool).await;
    let ch = character(pool, USER, "Ada").await;
    let id = queue::enqueue(pool, S, USER, ch, "a secret: the gate code is 5150", None)
        .await
        .unwrap();
    let claimed = queue::claim(pool, "w-race", 60_000, &["live".into()])
        .await
        .unwrap()
        .expect("claimable");
    assert_eq!(claimed.id, id);
    (id.0, claimed.fencing_token)
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// What no erase may leave behind: rows of the session, or a log row of a turn that is gone.
async fn nothing_left(pool: &PgPool) {
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM turns WHERE session_id = 's-race'"
        )
        .await,
        0
    );
    assert_eq!(
        count(pool, "SELECT count(*) FROM turn_log l WHERE NOT EXISTS (SELECT 1 FROM turns t WHERE t.id = l.turn_id)").await,
        0
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM session_locks WHERE session_id = 's-race'"
        )
        .await,
        0
    );
}

const FENCE_AND_LOG: &str = "SELECT turn_id FROM session_locks
  WHERE session_id = $1 AND fencing_token = $2 FOR UPDATE";
const LOG: &str =
    "INSERT INTO turn_log (turn_id, attempt, worker_id, path, sid, status, started_at)
  VALUES ($1, 1, 'w-race', 'cold', $2, 'ok', now())";

#[sqlx::test(migrations = false)]
async fn an_erase_waits_for_a_completion_holding_the_lease(pool: PgPool) {
    let (turn, token) = running_turn(&pool).await;
    // The completion: fence (the lease row, locked) and its log row, not yet committed.
    let mut completion = pool.begin().await.unwrap();
    let fenced: Option<i64> = sqlx::query_scalar(FENCE_AND_LOG)
        .bind(S)
        .bind(token)
        .fetch_optional(&mut *completion)
        .await
        .unwrap();
    assert_eq!(fenced, Some(turn));
    sqlx::query(LOG)
        .bind(turn)
        .bind(S)
        .execute(&mut *completion)
        .await
        .unwrap();

    let erasing = tokio::spawn({
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, Value>("SELECT kvmem_erase_session($1)")
                .bind(S)
                .fetch_one(&pool)
                .await
        }
    });
    blocked_on(&pool, "kvmem_erase_session").await;
    completion.commit().await.unwrap();
    let done = erasing
        .await
        .unwrap()
        .expect("the erase succeeds once the completion commits");
    assert_eq!(done["tables"]["turn_log"], 1, "{done}");
    assert_eq!(done["tables"]["turns"], 1, "{done}");
    nothing_left(&pool).await;
}

#[sqlx::test(migrations = false)]
async fn a_completion_after_an_erase_is_fenced_and_writes_nothing(pool: PgPool) {
    let (turn, token) = running_turn(&pool).await;
    let mut erase = pool.begin().await.unwrap();
    sqlx::query("SELECT kvmem_erase_session($1)")
        .bind(S)
        .execute(&mut *erase)
        .await
        .unwrap();
    let completing = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await?;
            let fenced: Option<i64> = sqlx::query_scalar(FENCE_AND_LOG)
                .bind(S)
                .bind(token)
                .fetch_optional(&mut *tx)
                .await?;
            if fenced.is_some() {
                sqlx::query(LOG)
                    .bind(turn)
                    .bind(S)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(fenced)
        }
    });
    blocked_on(&pool, "FOR UPDATE").await;
    erase.commit().await.unwrap();
    let fenced = completing
        .await
        .unwrap()
        .expect("the completion's transaction does not fail");
    assert_eq!(
        fenced, None,
        "the lease went with the erase: the completion is fenced"
    );
    nothing_left(&pool).await;
}

#[sqlx::test(migrations = false)]
async fn an_enqueue_during_an_erase_starts_the_session_anew_with_its_lease_row(pool: PgPool) {
    let (_, _) = running_turn(&pool).await;
    let ch: i64 = sqlx::query_scalar("SELECT id FROM user_characters WHERE user_id = $1")
        .bind(USER)
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut erase = pool.begin().await.unwrap();
    sqlx::query("SELECT kvmem_erase_session($1)")
        .bind(S)
        .execute(&mut *erase)
        .await
        .unwrap();
    let enqueueing = tokio::spawn({
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT kvmem_enqueue_turn($1, $2, $3, 'after the erase')")
                .bind(S)
                .bind(USER)
                .bind(ch)
                .fetch_one(&pool)
                .await
        }
    });
    blocked_on(&pool, "kvmem_enqueue_turn").await;
    erase.commit().await.unwrap();
    let id = enqueueing
        .await
        .unwrap()
        .expect("the enqueue succeeds after the erase");
    let (message, state): (String, String) =
        sqlx::query_as("SELECT message, state::text FROM turns WHERE session_id = $1")
            .bind(S)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (message.as_str(), state.as_str()),
        ("after the erase", "queued")
    );
    let head: Option<i64> =
        sqlx::query_scalar("SELECT head_turn_id FROM session_locks WHERE session_id = $1")
            .bind(S)
            .fetch_optional(&pool)
            .await
            .unwrap();
    assert_eq!(head, Some(id), "the new turn has its lease row");
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM turns WHERE message LIKE '%5150%'"
        )
        .await,
        0
    );
}

/// Sends one chat request carrying a history through the SDK at its default retries and
/// prints its attempts and the error it ended with.
const SDK_SCRIPT: &str = r#"
import json, sys, openai
base, character = sys.argv[1], int(sys.argv[2])
seen = []
def on_request(r):
    seen.append({"retry_count": r.headers.get("x-stainless-retry-count")})
def on_response(r):
    seen[-1].update(status=r.status_code, should_retry=r.headers.get("x-should-retry"))
client = openai.OpenAI(base_url=base, api_key="unused",
    http_client=openai.DefaultHttpxClient(event_hooks={"request": [on_request], "response": [on_response]}))
try:
    client.chat.completions.create(model="kvmem", user="u-race", messages=[
        {"role": "user", "content": "my gate code is 5150"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "and what else?"}],
        extra_body={"character_id": character})
    out = {"error": None}
except openai.APIStatusError as e:
    out = {"error": e.status_code}
out["attempts"] = seen
print(json.dumps(out), flush=True)
"#;

#[sqlx::test(migrations = false)]
async fn a_request_waiting_on_an_erased_turn_is_told_so_and_not_retried(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, USER, "Ada").await;
    // No worker: the turn stays queued while the request waits.
    let s = settings(json!({"http_timeout_ms": 60_000}));
    let state = crate::common::http_state(pool.clone(), Arc::new(s), "ab".repeat(32));
    let server = serve(state, None).await;
    let sdk = tokio::process::Command::new(openai_python())
        .args([
            "-c",
            SDK_SCRIPT,
            &format!("{}/v1", server.base),
            &ch.to_string(),
        ])
        .output();
    let sdk = tokio::spawn(sdk);
    let session = loop {
        let s: Option<String> = sqlx::query_scalar(
            "SELECT session_id FROM turns WHERE user_id = $1 AND state = 'queued'",
        )
        .bind(USER)
        .fetch_optional(&pool)
        .await
        .unwrap();
        if let Some(s) = s {
            break s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM turns WHERE message LIKE '%5150%'"
        )
        .await,
        1,
        "the request's history was imported into its new session"
    );
    sqlx::query("SELECT kvmem_erase_session($1, $2)")
        .bind(&session)
        .bind(USER)
        .execute(&pool)
        .await
        .unwrap();
    let out = sdk.await.unwrap().unwrap();
    assert_success(&out);
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["error"], 404, "{line}");
    let attempts = line["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "the SDK did not retry: {line}");
    assert_eq!(attempts[0]["should_retry"], "false", "{line}");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM turns").await,
        0,
        "nothing came back"
    );
    drop(server);
}
