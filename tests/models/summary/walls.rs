//! Who can read a summary: views, the CLI and the HTTP route.

use super::*;

const ALICE_SECRET: &str = "vault code 7319";

/// Alice has a closed session with a summary, a rolling summary, a spine and a merged user
/// context, all carrying her secret; Bob has one turn of his own. Written as the lane would
/// leave them: these tests are about who can read them.
async fn two_tenants(pool: &PgPool) -> (i64, i64) {
    common::migrate(pool).await;
    let a = common::character(pool, "alice", "Ada").await;
    let b = common::character(pool, "bob", "Bo").await;
    turn(
        pool,
        "alice",
        a,
        at(9, 0),
        "Remember the vault code 7319",
        "Noted",
    )
    .await;
    turn(pool, "bob", b, at(9, 0), "Hello", "Hi Bob").await;
    sqlx::query(
        "SELECT kvmem_summary_close(id, $1, 'test') FROM summary_sessions WHERE user_id = 'alice'",
    )
    .bind(at(10, 0))
    .execute(pool)
    .await
    .unwrap();
    let summary = json!({"one_liner": format!("Alice shared her {ALICE_SECRET}."),
        "what_mattered": [ALICE_SECRET], "open_loops": [], "commitments": [], "people": [],
        "tone": "calm"});
    for sql in [
        "INSERT INTO session_summaries (session_id, user_id, character_id, status, summary, attempts)
         SELECT id, user_id, character_id, 'ok', $1, 1 FROM summary_sessions WHERE user_id = 'alice'",
        "UPDATE session_state SET rolling_summary = 'Alice: ' || ($1->>'one_liner') WHERE user_id = 'alice'",
        "INSERT INTO rolling_summaries (user_id, character_id, message_count, last_message_id, content)
         SELECT user_id, character_id, 1, 0, rolling_summary FROM session_state WHERE user_id = 'alice'",
        "INSERT INTO summary_spine (user_id, version, content, sections, message_count, message_total_at)
         VALUES ('alice', 1, 'PROFILE:\n- ' || ($1->>'one_liner'), '{}', 20, 20)",
        "INSERT INTO user_contexts (scope, user_id, facts_hash, current_hash, historical_hash, context)
         VALUES ('', 'alice', 'f', 'c', 'h', $1->>'one_liner')",
    ] {
        sqlx::query(sql).bind(&summary).execute(pool).await.unwrap();
    }
    (a, b)
}

fn no_leak(what: &str, text: &str) {
    assert!(
        !text.contains("7319"),
        "{what} leaks Alice's summaries: {text}"
    );
}

#[sqlx::test(migrations = false)]
async fn views_keep_each_user_to_their_own_summaries(pool: PgPool) {
    let (a, b) = two_tenants(&pool).await;
    for view in [
        "kvmem_session_context",
        "kvmem_rolling_summary",
        "kvmem_session_summaries",
        "kvmem_spine",
        "kvmem_user_context",
        "kvmem_session_state",
    ] {
        let bob: Vec<Value> = sqlx::query_scalar(&format!(
            "SELECT to_jsonb(v) FROM {view} v WHERE user_id = 'bob'"
        ))
        .fetch_all(&pool)
        .await
        .unwrap();
        no_leak(view, &Value::from(bob).to_string());
        let alice: Vec<Value> = sqlx::query_scalar(&format!(
            "SELECT to_jsonb(v) FROM {view} v WHERE user_id = 'alice'"
        ))
        .fetch_all(&pool)
        .await
        .unwrap();
        let alice = Value::from(alice).to_string();
        assert!(
            alice.contains("7319"),
            "{view} lost Alice's own row: {alice}"
        );
    }
    let crossed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM kvmem_session_context WHERE user_id = 'bob' AND character_id = $1",
    )
    .bind(a)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(crossed, 0, "Bob with Alice's character finds nothing");
    let own: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM kvmem_session_context WHERE user_id = 'bob' AND character_id = $1",
    )
    .bind(b)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(own, 1, "Bob's own context row");
}

#[sqlx::test(migrations = false)]
async fn cli_shows_each_user_only_their_own_summaries(pool: PgPool) {
    let (a, _) = two_tenants(&pool).await;
    let url = common::db_url(&pool).await;
    let run = |args: &[&str]| {
        common::kvmem_command(&url)
            .args(["summary"])
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["show", "--user", "alice"]);
    common::assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("7319") && text.contains("spine v1"), "{text}");

    let out = run(&["show", "--user", "bob"]);
    common::assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    no_leak("summary show --user bob", &text);
    assert!(text.contains("spine: none yet"), "{text}");

    let out = run(&["show", "--user", "bob", "--character", &a.to_string()]);
    common::assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    no_leak("show with Alice's character", &text);
    assert!(text.contains("no session state for user bob"), "{text}");

    let alices_jobs = || {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM summary_jobs WHERE user_id = 'alice' OR character_id = $1",
        )
        .bind(a)
        .fetch_one(&pool)
    };
    let before = alices_jobs().await.unwrap();
    let out = run(&["rebuild", "--user", "bob", "--character", &a.to_string()]);
    common::assert_success(&out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "queued 1 summary jobs"
    );
    assert_eq!(
        alices_jobs().await.unwrap(),
        before,
        "only Bob's spine was queued"
    );

    let out = run(&["show", "--user", "  "]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--user must not be blank"), "{err}");

    let out = common::kvmem_command(&url).arg("status").output().unwrap();
    common::assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("summary lane:") && text.contains("spine    queued   1"),
        "{text}"
    );
}

#[sqlx::test(migrations = false)]
async fn http_summary_route_serves_the_caller_only(pool: PgPool) {
    let (a, b) = two_tenants(&pool).await;
    let state = crate::common::http_state(
        pool.clone(),
        Arc::new(common::settings(json!({}))),
        String::new(),
    );
    let api = common::serve(state, None).await;
    let base = &api.base;
    let client = reqwest::Client::new();
    let get = |user: &str, character: i64| {
        client
            .get(format!(
                "{base}/v1/memory/summary?user={user}&character={character}"
            ))
            .send()
    };

    let r = get("alice", a).await.unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["user_id"], "alice");
    assert_eq!(body["spine_version"], 1);
    assert!(body["latest_session_summary"]["one_liner"]
        .as_str()
        .unwrap()
        .contains("7319"));

    let r = get("bob", a).await.unwrap();
    assert_eq!(r.status(), 404);
    no_leak("Bob asking for Alice's character", &r.text().await.unwrap());

    let r = get("bob", b).await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    no_leak("Bob's own summaries", &text);
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["latest_session_summary"], Value::Null);
    assert_eq!(body["spine"], Value::Null);

    let r = get("%20", b).await.unwrap();
    assert_eq!(r.status(), 400);
    let r = client
        .get(format!("{base}/v1/memory/summary?user=bob&character=x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "a character that is not a number");
}
