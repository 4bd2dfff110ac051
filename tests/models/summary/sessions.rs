//! Session close, rolling and spine triggers, validation and retries.

use super::*;

#[sqlx::test(migrations = false)]
async fn a_session_closes_after_30_idle_minutes_on_the_clock(pool: PgPool) {
    let svc = service(&pool, tiny_engine(), config()).await;
    let c = common::character(&pool, "ann", "Vega").await;
    turn(&pool, "ann", c, at(10, 0), "Hello there", "Hi").await;
    turn(&pool, "ann", c, at(10, 5), "I moved to Porto", "Nice").await;
    turn(&pool, "ann", c, at(10, 10), "My sister is Ana", "Good").await;
    let s = sessions(&pool).await;
    assert_eq!(s.len(), 1);
    assert_eq!(
        (s[0].1, s[0].2),
        (None, 3),
        "one open session, 3 user messages"
    );
    let due: DateTime<Utc> = sqlx::query_scalar(
        "SELECT run_at FROM summary_jobs WHERE kind = 'close' AND state = 'queued'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(due, at(10, 40), "due 30 minutes after the last activity");

    // 29:59 idle: nothing is due.
    let early = jobs::process_next_summary_job_at(&svc, at(10, 40) - Duration::seconds(1))
        .await
        .unwrap();
    assert_eq!(early, Outcome::Empty);
    assert_eq!(sessions(&pool).await[0].1, None);

    // 30:00 idle: the close runs, then the session summary it queued.
    let ran = jobs::drain_at(&svc, at(10, 40)).await.unwrap();
    let kinds: Vec<&str> = ran.iter().map(|o| kind(o).0).collect();
    assert_eq!(kinds, vec!["close", "session", "context"]);
    assert_eq!(sessions(&pool).await[0].1, Some(at(10, 40)));
    let summaries: i64 =
        sqlx::query_scalar("SELECT count(*) FROM session_summaries WHERE session_id = $1")
            .bind(sessions(&pool).await[0].0)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(summaries, 1, "stored as ok or as an error, once");
    let closed_events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE kind = 'summary_session_closed' AND detail->>'closed_by' = 'idle'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(closed_events, 1);

    // The next message opens a new session; session_state carries on.
    turn(&pool, "ann", c, at(11, 0), "Back again", "Welcome").await;
    let s = sessions(&pool).await;
    assert_eq!(s.len(), 2);
    assert_eq!((s[1].1, s[1].2), (None, 1));
    let count: i32 =
        sqlx::query_scalar("SELECT message_count FROM session_state WHERE user_id = 'ann'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(count, 4);

    // Activity moves the deadline: a message at 11:20 makes 11:45 too early. The only job
    // due then is the rolling summary the 4th user message queued.
    turn(&pool, "ann", c, at(11, 20), "Still here", "Yes").await;
    let o = jobs::process_next_summary_job_at(&svc, at(11, 45))
        .await
        .unwrap();
    assert_eq!(kind(&o).0, "rolling");
    let o = jobs::process_next_summary_job_at(&svc, at(11, 45))
        .await
        .unwrap();
    assert_eq!(o, Outcome::Empty);
    assert_eq!(
        sessions(&pool).await[1].1,
        None,
        "idle 25 minutes is not closed"
    );

    // Without the job running, the next message past the deadline closes it itself.
    turn(&pool, "ann", c, at(12, 30), "Much later", "Hello").await;
    let s = sessions(&pool).await;
    assert_eq!(s.len(), 3);
    assert_eq!(s[1].1, Some(at(11, 50)), "ended at its idle deadline");
    let by_message: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE kind = 'summary_session_closed' AND detail->>'closed_by' = 'next_message'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(by_message, 1);
    assert_eq!(
        queued(&pool, "session").await,
        1,
        "its session summary is queued"
    );
}

/// `kvmem summary rebuild` queues rolling and spine jobs flagged `rebuild`; the message
/// beats that come before they run must not turn them back into ordinary jobs.
#[sqlx::test(migrations = false)]
async fn a_queued_rebuild_survives_the_next_beats(pool: PgPool) {
    common::migrate(&pool).await;
    let c = common::character(&pool, "cy", "Vega").await;
    for i in 1..=3 {
        turn(&pool, "cy", c, at(9, i), &format!("message {i}"), "ok").await;
    }
    let queued_now: i64 =
        sqlx::query_scalar(include_str!("../../../sql/summary/rebuild_queue.sql"))
            .bind("cy")
            .bind(c)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(queued_now, 2, "a rolling and a spine rebuild");
    // The 4th user message is a rolling beat; the 20th a spine beat.
    for i in 4..=20 {
        turn(&pool, "cy", c, at(9, i), &format!("message {i}"), "ok").await;
    }
    let payload = |kind: &'static str| {
        sqlx::query_scalar::<_, Value>(
            "SELECT payload FROM summary_jobs WHERE kind = $1 AND state = 'queued'",
        )
        .bind(kind)
        .fetch_one(&pool)
    };
    let rolling = payload("rolling").await.unwrap();
    assert_eq!(rolling["rebuild"], json!(true), "{rolling}");
    assert_eq!(rolling["message_count"], json!(20), "{rolling}");
    assert_eq!(payload("spine").await.unwrap(), json!({"rebuild": true}));
    assert_eq!(queued(&pool, "rolling").await, 1);
    assert_eq!(queued(&pool, "spine").await, 1);
}

#[sqlx::test(migrations = false)]
async fn rolling_every_4_turns_keeps_history_and_spine_at_20(pool: PgPool) {
    let mut cfg = config();
    // The random tiny model fills every string the grammar allows: room for the longest.
    cfg.spine_max_tokens = 2500;
    let svc = service(&pool, tiny_engine(), cfg).await;
    let c = common::character(&pool, "bo", "Vega").await;
    for i in 1..=3 {
        turn(&pool, "bo", c, at(9, i), &format!("message {i}"), "ok").await;
    }
    assert_eq!(
        queued(&pool, "rolling").await,
        0,
        "3 turns: no rolling summary"
    );
    turn(&pool, "bo", c, at(9, 4), "message 4", "ok").await;
    assert_eq!(
        queued(&pool, "rolling").await,
        1,
        "4 turns: a rolling summary"
    );
    let ran = jobs::drain_at(&svc, at(9, 5)).await.unwrap();
    assert_eq!(
        ran.iter().map(kind).collect::<Vec<_>>(),
        vec![("rolling", true)]
    );
    let first =
        sqlx::query("SELECT id, content, previous_id, message_count FROM rolling_summaries")
            .fetch_one(&pool)
            .await
            .unwrap();
    let content: String = first.get("content");
    assert!(!content.is_empty() && content.chars().count() <= 600);
    assert_eq!(first.get::<Option<i64>, _>("previous_id"), None);
    assert_eq!(first.get::<i32, _>("message_count"), 4);
    let st = sqlx::query("SELECT rolling_summary, last_rolling_attempt_at, last_rolling_success_at, last_rolling_error FROM session_state WHERE user_id = 'bo'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(st.get::<String, _>("rolling_summary"), content);
    assert_eq!(
        st.get::<Option<DateTime<Utc>>, _>("last_rolling_success_at"),
        Some(at(9, 5))
    );
    assert_eq!(
        st.get::<Option<DateTime<Utc>>, _>("last_rolling_attempt_at"),
        Some(at(9, 5))
    );
    assert_eq!(st.get::<Option<Value>, _>("last_rolling_error"), None);

    for i in 5..=8 {
        turn(&pool, "bo", c, at(9, i + 1), &format!("message {i}"), "ok").await;
    }
    jobs::drain_at(&svc, at(9, 10)).await.unwrap();
    let ids: Vec<(i64, Option<i64>)> =
        sqlx::query_as("SELECT id, previous_id FROM rolling_summaries ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(ids.len(), 2, "history kept, not overwritten");
    assert_eq!(ids[1].1, Some(ids[0].0), "the second links the first");

    // Spine: 19 user messages (over two characters) queue none; the 20th does.
    let c2 = common::character(&pool, "bo", "Orion").await;
    for i in 0..11 {
        turn(&pool, "bo", c2, at(9, 20 + i), &format!("other {i}"), "ok").await;
    }
    assert_eq!(queued(&pool, "spine").await, 0, "19 messages");
    turn(&pool, "bo", c2, at(9, 40), "the twentieth", "ok").await;
    assert_eq!(queued(&pool, "spine").await, 1, "20 messages");
    let payload: Value =
        sqlx::query_scalar("SELECT payload FROM summary_jobs WHERE kind = 'spine'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(payload, json!({"message_total": 20}));

    // The spine job makes version 1 with seed 001's four sections; 20 more messages make
    // version 2 and keep version 1.
    let ran = jobs::drain_at(&svc, at(9, 41)).await.unwrap();
    let spine = ran
        .iter()
        .find_map(|o| match o {
            Outcome::Done { kind, result, .. } if kind == "spine" => Some(result.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no spine job done: {ran:?}"));
    assert_eq!(
        (spine["version"].as_i64(), spine["message_count"].as_i64()),
        (Some(1), Some(20))
    );
    for i in 0..20 {
        turn(&pool, "bo", c2, at(10, i), &format!("more {i}"), "ok").await;
    }
    jobs::drain_at(&svc, at(10, 30)).await.unwrap();
    let versions: Vec<(i32, i32, String)> = sqlx::query_as(
        "SELECT version, message_total_at, content FROM summary_spine WHERE user_id = 'bo' ORDER BY version",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(versions.len(), 2, "a new row per version");
    assert_eq!((versions[0].0, versions[0].1), (1, 20));
    assert_eq!((versions[1].0, versions[1].1), (2, 40));
    for (_, _, content) in &versions {
        let headings: Vec<&str> = content.lines().filter(|l| !l.starts_with("- ")).collect();
        assert_eq!(
            headings,
            ["PROFILE:", "PROJECTS:", "PEOPLE:", "OPEN_LOOPS:"],
            "{content}"
        );
    }
    let current: i32 = sqlx::query_scalar("SELECT version FROM kvmem_spine WHERE user_id = 'bo'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(current, 2);
}

#[sqlx::test(migrations = false)]
async fn invalid_session_json_is_retried_then_stored_as_an_error(pool: PgPool) {
    let mut cfg = config();
    cfg.session_max_tokens = 12; // too few tokens for the schema: every answer is cut off
    cfg.max_attempts = 3;
    let svc = service(&pool, tiny_engine(), cfg).await;
    let c = common::character(&pool, "cy", "Vega").await;
    turn(
        &pool,
        "cy",
        c,
        at(8, 0),
        "I start a new job on Monday",
        "Good luck",
    )
    .await;
    let ran = jobs::drain_at(&svc, at(8, 30)).await.unwrap();
    assert_eq!(
        ran.iter().map(kind).collect::<Vec<_>>(),
        vec![("close", true), ("session", false), ("context", true)]
    );
    let r =
        sqlx::query("SELECT status, summary, error, attempts, raw_answers FROM session_summaries")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(r.get::<String, _>("status"), "error");
    assert_eq!(
        r.get::<Option<Value>, _>("summary"),
        None,
        "never stored as a summary"
    );
    assert_eq!(r.get::<i32, _>("attempts"), 3);
    let raw: Value = r.get("raw_answers");
    assert_eq!(
        raw.as_array().unwrap().len(),
        3,
        "each attempt's answer is kept"
    );
    assert!(
        r.get::<String, _>("error").contains("cut off"),
        "{}",
        r.get::<String, _>("error")
    );
    let failed: i64 = sqlx::query_scalar("SELECT count(*) FROM events WHERE kind = 'summary_job_failed' AND detail->>'kind' = 'session'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(failed, 1);
    let status = kvmem::cmd::status::report(&pool).await.unwrap();
    assert!(
        status.contains("session  failed   1") && status.contains("summary_job_failed"),
        "kvmem status shows the failure: {status}"
    );
    assert!(status.contains("cut off"), "{status}");
}

const PORTO: [(&str, &str); 4] = [
    (
        "Hi, I'm Sam. I just moved to Porto with my sister Ana.",
        "Welcome to Porto, Sam! How is the move going?",
    ),
    (
        "Stressful. I still need to find a flat near the river.",
        "Finding a flat takes time. Have you looked at listings?",
    ),
    (
        "Yes, I promised Ana I would visit three flats on Saturday.",
        "That sounds like a good plan for Saturday.",
    ),
    (
        "I also start my new nursing job next week, so I'm nervous.",
        "It is normal to be nervous. You will do well.",
    ),
];

#[sqlx::test(migrations = false)]
async fn smollm2_writes_a_valid_session_summary_and_a_rolling_summary(pool: PgPool) {
    let svc = service(&pool, smol_engine(), config()).await;
    let c = common::character(&pool, "sam", "Vega").await;
    for (i, (u, r)) in PORTO.iter().enumerate() {
        turn(&pool, "sam", c, at(18, i as u32), u, r).await;
    }
    let ran = jobs::drain_at(&svc, at(18, 40)).await.unwrap();
    let kinds: Vec<(&str, bool)> = ran.iter().map(kind).collect();
    assert_eq!(
        kinds,
        vec![
            ("close", true),
            ("rolling", true),
            ("session", true),
            ("context", true)
        ],
        "{ran:?}"
    );
    // The close also made seed 004's user context for the next session: today's summary
    // by the model, stored where a restarted or another worker finds it.
    let Outcome::Done { result, .. } = &ran[3] else {
        unreachable!()
    };
    assert_eq!(result["sources"]["current_day"], "computed", "{result}");
    assert_eq!(result["degraded"], serde_json::json!([]), "{result}");
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM user_contexts WHERE user_id = 'sam'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, 1, "the merged context is stored");
    let rolling: String = sqlx::query_scalar("SELECT content FROM rolling_summaries")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(rolling.chars().count() <= 600);
    assert!(
        rolling.contains("Porto") || rolling.contains("flat") || rolling.contains("Ana"),
        "{rolling}"
    );
    let summary: Value =
        sqlx::query_scalar("SELECT summary FROM session_summaries WHERE status = 'ok'")
            .fetch_one(&pool)
            .await
            .unwrap();
    let s = schema::validate(&summary.to_string(), false).expect("stored summary validates");
    eprintln!("rolling: {rolling}\nsession: {summary}");
    assert!(!s.one_liner.trim().is_empty());
    let said: String = sqlx::query_scalar("SELECT string_agg(content, ' ') FROM messages")
        .fetch_one(&pool)
        .await
        .unwrap();
    for person in &s.people {
        assert!(
            said.contains(person.as_str()),
            "people names {person:?}, which the conversation never writes"
        );
    }
    let text = summary.to_string().to_lowercase();
    for copied in [
        "what mattered to the user",
        "still unresolved",
        "anyone promised",
        "who was mentioned",
    ] {
        assert!(
            !text.contains(copied),
            "the summary copies the prompt: {text}"
        );
    }
    assert!(
        ["porto", "ana", "flat", "nurs"]
            .iter()
            .any(|w| text.contains(w)),
        "the summary says nothing of the conversation: {text}"
    );
    let view: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM kvmem_session_summaries WHERE status = 'ok' AND turn_count = 4",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(view, 1);
}
