//! The daily cache: keys, invalidation, day rollover and degradation with a failing model.

use super::*;

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
    let other = kvmem::system::summary_service_on(pool.clone(), roomy(), Some(tiny_engine()), None)
        .unwrap();
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
    let bad =
        kvmem::system::summary_service_on(pool.clone(), broken, Some(tiny_engine()), None).unwrap();
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
    let none = kvmem::system::summary_service_on(pool.clone(), config(), None, None).unwrap();
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
