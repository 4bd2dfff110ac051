//! Compaction, task pruning and the context document's round trip.

use super::*;

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

const SEED_003: &str = include_str!("../../fixtures/seed003_context.json");

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

const RECENT_HISTORY: &str = include_str!("../../../sql/turn/recent_history.sql");

#[sqlx::test(migrations = false)]
async fn compacting_a_chat_session_moves_the_boundary_and_keeps_messages(pool: PgPool) {
    let svc = service(&pool, tiny_engine(), config()).await;
    sqlx::query("UPDATE kvmem_config SET value = '1000' WHERE key = 'summary_spine_every'")
        .execute(&pool)
        .await
        .unwrap();
    let c = common::character(&pool, "dee", "Vega").await;
    let sid = format!("chat-dee-{c}");
    for i in 1..=28 {
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
        if i == 24 {
            assert_eq!(queued(&pool, "compact").await, 0, "48 entries: not yet");
        }
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
