//! Summaries (issue 14) on real Postgres and real models: the 30-minute close on a clock the
//! test moves, the 4-turn and 20-message triggers, session-summary validation and retries,
//! seed 004's cache keys, invalidation and day rollover, degradation with a failing model,
//! seed 003's compaction (51 entries, > 100k tokens), task pruning and JSON round-trip. The
//! tiny random model drives mechanics; SmolLM2 is used where the text matters.

mod common;

use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Duration, NaiveDate, TimeZone, Utc};
use kvmem::engine::Engine;
use kvmem::summary::cache::Source;
use kvmem::summary::context_manager::{
    bullet_summary, ContextCompactor, ContextData, ContextManager, HistoryEntry, Task, TaskStatus,
};
use kvmem::summary::jobs::{self, Outcome};
use kvmem::summary::{daily, schema, SummaryConfig, SummaryService};
use serde_json::{json, Value};
use sqlx::{PgPool, Row};

fn tiny_engine() -> Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        common::load_engine(
            &common::tiny_model(),
            &common::settings(json!({"n_ctx": 4096})),
        )
    })
    .clone()
}

fn smol_engine() -> Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        common::load_engine(
            &common::smollm2(),
            &common::settings(json!({"n_ctx": 4096})),
        )
    })
    .clone()
}

fn config() -> SummaryConfig {
    SummaryConfig::from_settings(&common::settings(json!({})))
}

async fn service(pool: &PgPool, engine: Arc<Engine>, config: SummaryConfig) -> SummaryService {
    common::migrate(pool).await;
    SummaryService::with_engine(pool.clone(), config, engine).expect("summary service")
}

fn at(h: u32, m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 10, h, m, 0).unwrap()
}

/// A done turn with its two messages at `when`, as the completion writes them.
async fn turn(
    pool: &PgPool,
    user: &str,
    character: i64,
    when: DateTime<Utc>,
    text: &str,
    reply: &str,
) -> i64 {
    let turn: i64 = sqlx::query_scalar(
        "INSERT INTO turns (session_id, user_id, character_id, message, state, reply)
         VALUES ($1, $2, $3, $4, 'done', $5) RETURNING id",
    )
    .bind(format!("chat-{user}-{character}"))
    .bind(user)
    .bind(character)
    .bind(text)
    .bind(reply)
    .fetch_one(pool)
    .await
    .unwrap();
    for (role, content) in [("user", text), ("assistant", reply)] {
        sqlx::query("INSERT INTO messages (session_id, turn_id, role, content, created_at) VALUES ($1, $2, $3, $4, $5)")
            .bind(format!("chat-{user}-{character}"))
            .bind(turn)
            .bind(role)
            .bind(content)
            .bind(when)
            .execute(pool)
            .await
            .unwrap();
    }
    turn
}

async fn queued(pool: &PgPool, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM summary_jobs WHERE kind = $1 AND state = 'queued'")
        .bind(kind)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn sessions(pool: &PgPool) -> Vec<(i64, Option<DateTime<Utc>>, i32)> {
    sqlx::query("SELECT id, ended_at, turn_count FROM summary_sessions ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get("id"), r.get("ended_at"), r.get("turn_count")))
        .collect()
}

fn kind(o: &Outcome) -> (&str, bool) {
    match o {
        Outcome::Done { kind, .. } => (kind, true),
        Outcome::Failed { kind, .. } => (kind, false),
        Outcome::Empty => ("empty", true),
        Outcome::Busy => ("busy", true),
    }
}

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
    let queued_now: i64 = sqlx::query_scalar(include_str!("../sql/summary/rebuild_queue.sql"))
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

/// Two users' messages in `guild` (None = direct chats) on 2026-03-10 (today) and on two
/// of days 2–7.
async fn seed_days(pool: &PgPool, guild: Option<&str>) {
    let rows = [
        (
            "u1",
            "2026-03-10T09:00:00Z",
            "I ran 10 km this morning, feeling great.",
        ),
        ("u2", "2026-03-10T09:05:00Z", "My cat is sick, I'm worried."),
        (
            "u1",
            "2026-03-05T19:00:00Z",
            "Work was stressful, went to the gym after.",
        ),
        (
            "u1",
            "2026-03-08T20:00:00Z",
            "Another long day, gym again to clear my head.",
        ),
        (
            "u2",
            "2026-03-08T08:00:00Z",
            "Baked bread for the neighbours.",
        ),
    ];
    for (i, (user, when, text)) in rows.iter().enumerate() {
        sqlx::query(
            "INSERT INTO memory_messages (user_id, guild_id, session_id, message_id, speaker, text, at)
             VALUES ($1, $5, 's', $2, $1, $3, $4::timestamptz)",
        )
        .bind(user)
        .bind(format!("m{i}"))
        .bind(text)
        .bind(when)
        .bind(guild)
        .execute(pool)
        .await
        .unwrap();
    }
}

fn roomy() -> SummaryConfig {
    let mut c = config();
    // The random tiny model writes long strings up to the grammar's bound.
    c.daily_max_tokens_per_user = 700;
    c
}

#[sqlx::test(migrations = false)]
async fn cache_keys_invalidation_and_day_rollover(pool: PgPool) {
    let svc = service(&pool, tiny_engine(), roomy()).await;
    seed_days(&pool, Some("g1")).await;
    let src = |c: &daily::UserContext, k: &str| c.sources.get(k).copied();

    let t1 = at(14, 10);
    let c1 = daily::user_context(&svc, "g1", "u1", t1).await.unwrap();
    assert!(c1.degraded.is_empty(), "{:?}", c1.degraded);
    assert_eq!(src(&c1, "current_day"), Some(Source::Computed));
    assert_eq!(src(&c1, "historical"), Some(Source::Computed));
    assert_eq!(src(&c1, "merged"), Some(Source::Computed));
    assert!(c1.current_day.is_some() && c1.historical.is_some());
    // Seed 004's keys.
    assert!(svc
        .caches
        .current_day
        .contains_key(&("guild:g1".to_string(), "2026-03-10-14".to_string())));
    for d in 4..=9 {
        let day = NaiveDate::from_ymd_opt(2026, 3, d).unwrap();
        assert!(
            svc.caches
                .past_days
                .contains_key(&("guild:g1".to_string(), day)),
            "day {day}"
        );
    }
    let yesterday = NaiveDate::from_ymd_opt(2026, 3, 9).unwrap();
    assert!(svc
        .caches
        .historical
        .contains_key(&("g1".to_string(), "u1".to_string(), yesterday)));
    let batch: Value = sqlx::query_scalar(
        "SELECT summaries FROM daily_summaries WHERE day = '2026-03-10' AND bucket = '14'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let users: Vec<&String> = batch.as_object().unwrap().keys().collect();
    assert_eq!(
        users,
        vec!["u1", "u2"],
        "one batch call covers every active user of the guild's day"
    );

    // Same hour: everything from memory.
    let c2 = daily::user_context(&svc, "g1", "u1", at(14, 50))
        .await
        .unwrap();
    assert_eq!(src(&c2, "current_day"), Some(Source::Memory));
    assert_eq!(src(&c2, "historical"), Some(Source::Memory));
    assert_eq!(src(&c2, "merged"), Some(Source::Memory));
    assert_eq!(c2.context, c1.context);

    // Next hour bucket: the current day is made again; days 2–7 are not.
    let c3 = daily::user_context(&svc, "g1", "u1", at(15, 5))
        .await
        .unwrap();
    assert_eq!(src(&c3, "current_day"), Some(Source::Computed));
    assert_eq!(src(&c3, "historical"), Some(Source::Memory));

    // Another worker (empty caches, same database) reuses the stored results.
    let other = SummaryService::with_engine(pool.clone(), roomy(), tiny_engine()).unwrap();
    let c4 = daily::user_context(&other, "g1", "u1", at(15, 30))
        .await
        .unwrap();
    assert_eq!(src(&c4, "current_day"), Some(Source::Db));
    assert_eq!(src(&c4, "historical"), Some(Source::Db));
    assert_eq!(src(&c4, "merged"), Some(Source::Db));
    assert_eq!(c4.context, c3.context);

    // New facts change the merge key only.
    sqlx::query("INSERT INTO memory_blobs (user_id, guild_id, blob) VALUES ('u1', 'g1', 'u1 lives in Berlin.')")
        .execute(&pool)
        .await
        .unwrap();
    let c5 = daily::user_context(&svc, "g1", "u1", at(15, 40))
        .await
        .unwrap();
    assert_eq!(src(&c5, "current_day"), Some(Source::Memory));
    assert_eq!(src(&c5, "merged"), Some(Source::Computed));
    assert!(
        c5.context.contains("u1 lives in Berlin."),
        "facts win: {}",
        c5.context
    );

    // Day rollover: yesterday becomes a past day, days 2–7 get a new end date.
    let c6 = daily::user_context(
        &svc,
        "g1",
        "u1",
        Utc.with_ymd_and_hms(2026, 3, 11, 0, 30, 0).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(src(&c6, "historical"), Some(Source::Computed));
    let today = NaiveDate::from_ymd_opt(2026, 3, 10).unwrap();
    assert!(svc
        .caches
        .historical
        .contains_key(&("g1".to_string(), "u1".to_string(), today)));
    let full_day: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM daily_summaries WHERE day = '2026-03-10' AND bucket = 'day'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        full_day, 1,
        "the finished day is summarised whole under its date"
    );

    // Hit rates are in /metrics.
    let text = kvmem::metrics::Metrics::new().render(&pool).await.unwrap();
    assert!(
        text.contains("kvmem_summary_cache_lookups_total{cache=\"current_day\",result=\"memory\"}"),
        "{text}"
    );
    assert!(
        text.contains("kvmem_summary_cache_hit_ratio{cache=\"historical\"}"),
        "{text}"
    );
}

#[sqlx::test(migrations = false)]
async fn a_failing_model_degrades_to_what_exists_in_priority_order(pool: PgPool) {
    let good = service(&pool, tiny_engine(), roomy()).await;
    seed_days(&pool, None).await;
    sqlx::query(
        "INSERT INTO memory_blobs (user_id, guild_id, blob) VALUES ('u1', '', 'u1 is a nurse.')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let made = daily::user_context(&good, "", "u1", at(14, 10))
        .await
        .unwrap();
    let (current, historical) = (
        made.current_day.clone().unwrap(),
        made.historical.clone().unwrap(),
    );

    // The same model, asked for more tokens than its context holds: every call fails.
    let mut broken = roomy();
    for b in [
        &mut broken.daily_max_tokens_per_user,
        &mut broken.historical_max_tokens,
        &mut broken.merge_max_tokens,
        &mut broken.rolling_max_tokens,
    ] {
        *b = 100_000;
    }
    let bad = SummaryService::with_engine(pool.clone(), broken, tiny_engine()).unwrap();
    // Stored day summaries still serve; the merge fails and falls back.
    sqlx::query("INSERT INTO memory_blobs (user_id, guild_id, blob) VALUES ('u1', '', 'u1 is a nurse in Porto.') ON CONFLICT (user_id, guild_id) DO UPDATE SET blob = EXCLUDED.blob")
        .execute(&pool)
        .await
        .unwrap();
    let c = daily::user_context(&bad, "", "u1", at(14, 20))
        .await
        .unwrap();
    assert_eq!(
        c.context,
        format!(
            "Facts: u1 is a nurse in Porto.\nToday: {current}\nEarlier this week: {historical}"
        )
    );
    assert_eq!(c.degraded.len(), 1);
    assert!(
        c.degraded[0].starts_with("merge: model:"),
        "{:?}",
        c.degraded
    );

    // A new hour: no stored current day, and the model cannot make one.
    let c = daily::user_context(&bad, "", "u1", at(16, 0))
        .await
        .unwrap();
    assert_eq!(
        c.context,
        format!("Facts: u1 is a nurse in Porto.\nEarlier this week: {historical}")
    );
    assert!(
        c.degraded[0].starts_with("current day: model:"),
        "{:?}",
        c.degraded
    );
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE kind = 'summary_context_degraded'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(events, 2);

    // No model at all: facts only, and the rolling summary records why it failed.
    let none = SummaryService::new(pool.clone(), config(), None);
    let c = daily::user_context(
        &none,
        "",
        "u1",
        Utc.with_ymd_and_hms(2026, 3, 20, 9, 0, 0).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(c.context, "Facts: u1 is a nurse in Porto.");
    let ch = common::character(&pool, "u1", "Vega").await;
    for i in 1..=4 {
        turn(&pool, "u1", ch, at(20, i), &format!("m{i}"), "ok").await;
    }
    let ran = jobs::process_next_summary_job_at(&bad, at(20, 5))
        .await
        .unwrap();
    assert_eq!(kind(&ran), ("rolling", false));
    let err: Value =
        sqlx::query_scalar("SELECT last_rolling_error FROM session_state WHERE user_id = 'u1'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(err["reason"], "model_error");
    assert!(
        err["detail"].as_str().unwrap().contains("does not fit"),
        "{err}"
    );
}

fn entries(n: usize) -> Vec<HistoryEntry> {
    (1..=n)
        .map(|i| HistoryEntry {
            timestamp: 1_708_654_000 + i as i64,
            role: if i % 2 == 1 {
                "user".into()
            } else {
                "assistant".into()
            },
            content: format!("Message {i}"),
            token_count: Some(5),
        })
        .collect()
}

#[test]
fn compaction_at_51_entries_keeps_the_last_30() {
    let mut ctx = ContextData::new("user:agent:1");
    ctx.recent_history = entries(50);
    assert!(
        !ContextCompactor::compact(&mut ctx),
        "50 entries: nothing to do"
    );
    assert_eq!(ctx.recent_history.len(), 50);

    ctx.recent_history = entries(51);
    assert!(ContextCompactor::compact(&mut ctx));
    assert_eq!(ctx.recent_history.len(), 30);
    assert_eq!(ctx.recent_history[0].content, "Message 22");
    assert_eq!(ctx.recent_history[29].content, "Message 51");
    let mut expected = String::from("Previous conversation summary:");
    for i in 1..=21 {
        let role = if i % 2 == 1 { "user" } else { "assistant" };
        expected.push_str(&format!("\n- {role}: Message {i}"));
    }
    assert_eq!(ctx.long_term_summary, expected);
}

#[test]
fn compaction_over_100k_tokens_folds_the_oldest_half_counted_by_the_tokenizer() {
    let engine = tiny_engine();
    let mut ctx = ContextData::new("user:agent:2");
    let long = "the quick brown fox jumps over the lazy dog near the riverbank ".repeat(260);
    ctx.recent_history = (0..40)
        .map(|i| HistoryEntry {
            timestamp: i,
            role: "user".into(),
            content: format!("{i} {long}"),
            token_count: None,
        })
        .collect();
    assert_eq!(
        ContextCompactor::count_tokens(&mut ctx, engine.as_ref()),
        40
    );
    let per = engine.count_tokens(&ctx.recent_history[0].content);
    assert_eq!(ctx.recent_history[0].token_count, Some(per));
    assert_ne!(per, ctx.recent_history[0].content.len() / 4, "not len/4");
    assert!(ctx.history_tokens() > 100_000, "{}", ctx.history_tokens());
    let mut folded = 0;
    let changed = ContextCompactor::compact_with(&mut ctx, 0, &mut |e: &[HistoryEntry]| {
        folded += e.len();
        format!("{} entries", e.len())
    });
    assert!(changed);
    assert_eq!(folded, 20, "the oldest half");
    assert_eq!(ctx.recent_history.len(), 20);
    assert!(ctx.recent_history[0].content.starts_with("20 "));
    assert_eq!(ctx.long_term_summary, "20 entries");
    assert!(ctx.history_tokens() < 100_000);
}

#[test]
fn task_pruning_and_fact_dedup() {
    let now = 1_708_740_000;
    let task = |id: &str, status, updated_at| Task {
        id: id.into(),
        description: id.into(),
        status,
        progress: 0.5,
        created_at: 0,
        updated_at,
    };
    let mut ctx = ContextData::new("user:agent:3");
    ctx.active_tasks = vec![
        task("running_old", TaskStatus::Running, now - 90_000),
        task("done_23h", TaskStatus::Completed, now - 23 * 3600),
        task("done_25h", TaskStatus::Completed, now - 25 * 3600),
        task("failed_old", TaskStatus::Failed, now - 90_000),
    ];
    ctx.facts = vec!["b".into(), "a".into(), "b".into()];
    assert!(ContextCompactor::compact_with(
        &mut ctx,
        now,
        &mut |e: &[HistoryEntry]| bullet_summary(e)
    ));
    let ids: Vec<&str> = ctx.active_tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, vec!["running_old", "done_23h", "failed_old"]);
    assert_eq!(ctx.facts, vec!["a", "b"]);
    assert!(!ContextCompactor::compact_with(
        &mut ctx,
        now,
        &mut |e: &[HistoryEntry]| bullet_summary(e)
    ));
}

const SEED_003: &str = include_str!("fixtures/seed003_context.json");

#[sqlx::test(migrations = false)]
async fn seed_003_document_round_trips_exactly(pool: PgPool) {
    common::migrate(&pool).await;
    let ctx = ContextData::from_json(SEED_003).unwrap();
    assert_eq!(ctx.session_id, "user:agent:timestamp");
    assert_eq!(ctx.recent_history[2].token_count, Some(12));
    assert_eq!(ctx.active_tasks[0].status, TaskStatus::Running);
    assert_eq!(ctx.to_json().unwrap(), SEED_003, "serde form");

    let mgr = ContextManager::new(pool.clone());
    mgr.initialize().await.unwrap();
    mgr.save(&ctx).await.unwrap();
    assert_eq!(mgr.load("user:agent:timestamp").await.unwrap(), ctx);
    assert_eq!(
        mgr.export_text("user:agent:timestamp")
            .await
            .unwrap()
            .as_deref(),
        Some(SEED_003)
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ctx.json");
    assert!(mgr.export("user:agent:timestamp", &file).await.unwrap());
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        SEED_003,
        "export file"
    );

    mgr.delete("user:agent:timestamp").await.unwrap();
    assert!(mgr.list_sessions().await.unwrap().is_empty());
    assert_eq!(mgr.import(&file).await.unwrap(), "user:agent:timestamp");
    assert_eq!(
        mgr.export_text("user:agent:timestamp")
            .await
            .unwrap()
            .as_deref(),
        Some(SEED_003),
        "import"
    );
    let fresh = mgr.load("user:agent:new").await.unwrap();
    assert_eq!(fresh, ContextData::new("user:agent:new"), "load creates");
    assert_eq!(
        mgr.list_sessions().await.unwrap(),
        vec!["user:agent:new", "user:agent:timestamp"]
    );
}

const RECENT_HISTORY: &str = include_str!("../sql/turn/recent_history.sql");

#[sqlx::test(migrations = false)]
async fn compacting_a_chat_session_moves_the_boundary_and_keeps_messages(pool: PgPool) {
    let svc = service(&pool, tiny_engine(), config()).await;
    sqlx::query("UPDATE kvmem_config SET value = '1000' WHERE key = 'summary_spine_every'")
        .execute(&pool)
        .await
        .unwrap();
    let c = common::character(&pool, "dee", "Vega").await;
    let sid = format!("chat-dee-{c}");
    for i in 1..=24 {
        let when = at(7, 0) + Duration::seconds(i);
        turn(
            &pool,
            "dee",
            c,
            when,
            &format!("question {i}"),
            &format!("answer {i}"),
        )
        .await;
    }
    assert_eq!(queued(&pool, "compact").await, 0, "48 entries: not yet");
    for i in 25..=28 {
        let when = at(7, 0) + Duration::seconds(i);
        turn(
            &pool,
            "dee",
            c,
            when,
            &format!("question {i}"),
            &format!("answer {i}"),
        )
        .await;
    }
    assert_eq!(queued(&pool, "compact").await, 1, "over 50 entries");

    // The lane runs it (with the rolling summary queued on the same beat).
    let ran = jobs::drain_at(&svc, at(7, 5)).await.unwrap();
    let report = ran
        .iter()
        .find_map(|o| match o {
            Outcome::Done { kind, result, .. } if kind == "compact" => Some(result.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no compact job done: {ran:?}"));
    assert_eq!(report["compacted"], true);
    assert_eq!(
        (
            report["entries_before"].as_i64(),
            report["entries_after"].as_i64()
        ),
        (Some(56), Some(30))
    );
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM messages ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(ids.len(), 56, "messages stay the record");
    assert_eq!(
        report["boundary_message_id"].as_i64(),
        Some(ids[25]),
        "the 26 oldest are behind the boundary"
    );
    let ctx = ContextManager::new(pool.clone()).load(&sid).await.unwrap();
    assert_eq!(ctx.recent_history.len(), 30);
    assert_eq!(ctx.recent_history[0].content, "question 14");
    assert!(!ctx.long_term_summary.is_empty());
    assert!(ctx.recent_history.iter().all(|e| e.token_count.is_some()));

    // A cold start re-reads the recap, then only what lies past the boundary.
    // (turn id, user text, reply text); the recap is turn 0.
    let rows: Vec<(i64, String, String)> = sqlx::query_as(RECENT_HISTORY)
        .bind(&sid)
        .bind(200_i64)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 16, "recap + exchanges 14..=28");
    assert_eq!(rows[0].0, 0);
    assert_eq!(
        rows[0].2,
        format!("Earlier in this conversation: {}", ctx.long_term_summary)
    );
    assert_eq!(
        (rows[1].1.as_str(), rows[1].2.as_str()),
        ("question 14", "answer 14")
    );
    assert!(rows[1].0 > 0);
    assert_eq!(rows[15].1, "question 28");

    // No new job until 50 more entries pile up past the new boundary.
    for i in 29..=32 {
        let when = at(7, 10) + Duration::seconds(i);
        turn(
            &pool,
            "dee",
            c,
            when,
            &format!("question {i}"),
            &format!("answer {i}"),
        )
        .await;
    }
    assert_eq!(
        queued(&pool, "compact").await,
        0,
        "38 entries past the boundary"
    );
}

#[sqlx::test(migrations = false)]
async fn direct_chats_are_summarised_one_user_at_a_time(pool: PgPool) {
    let svc = service(&pool, tiny_engine(), roomy()).await;
    seed_days(&pool, None).await;
    let today = NaiveDate::from_ymd_opt(2026, 3, 10).unwrap();
    let start = Utc.from_utc_datetime(&today.and_hms_opt(0, 0, 0).unwrap());
    let (users, lines) = daily::day_lines(&svc, &daily::Batch::of("", "u1"), start, at(23, 0))
        .await
        .unwrap();
    assert_eq!(users, vec!["u1"]);
    assert_eq!(lines.len(), 1);
    assert!(lines[0].contains("I ran 10 km"), "{}", lines[0]);
    assert!(
        lines.iter().all(|l| !l.contains("cat")),
        "u2's words in u1's prompt"
    );

    daily::user_context(&svc, "", "u1", at(14, 10))
        .await
        .unwrap();
    daily::user_context(&svc, "", "u2", at(14, 10))
        .await
        .unwrap();
    let rows: Vec<(String, Value)> =
        sqlx::query_as("SELECT scope, summaries FROM daily_summaries ORDER BY scope, day")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(rows.iter().any(|(s, _)| s == "user:u1"));
    assert!(rows.iter().any(|(s, _)| s == "user:u2"));
    for (scope, summaries) in &rows {
        let keys: Vec<String> = summaries.as_object().unwrap().keys().cloned().collect();
        let own = scope.strip_prefix("user:").unwrap();
        assert!(
            keys.iter().all(|k| k == own),
            "batch {scope} summarises {keys:?}"
        );
    }
}

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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let state = kvmem::http::AppState::new(
        pool.clone(),
        Arc::new(common::settings(json!({}))),
        String::new(),
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(kvmem::http::serve(listener, state, shutdown.clone()));
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
    shutdown.cancel();
}

#[tokio::test]
async fn a_running_summary_asks_before_every_decode_step_and_waits_while_turns_run() {
    use kvmem::engine::Busy;
    use kvmem::summary::llm::{Prompt, Summarizer};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    // Busy for the first 40 checks (a turn generating), then free.
    let busy: Busy = Arc::new(move || seen.fetch_add(1, Ordering::SeqCst) < 40);
    let model = Summarizer::start(tiny_engine(), Some(busy)).unwrap();
    let prompt = Prompt {
        system: "Summarise the text.".into(),
        header: "Text:".into(),
        lines: vec!["the quick brown fox".into()],
        footer: "Summary:".into(),
        grammar: None,
        max_tokens: 16,
    };
    let g = model.generate(prompt).await.unwrap();
    assert!(g.truncated, "the random model used its whole budget: {g:?}");
    // 40 busy answers, then one free answer before each of >= 1 prompt decode and 16
    // token decodes.
    let n = calls.load(Ordering::SeqCst);
    assert!(n >= 40 + 17, "asked {n} times");
}
