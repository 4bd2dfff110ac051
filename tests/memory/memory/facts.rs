//! Facts: keys, history, concurrency, archiving, entity cards, remember/forget.

use super::*;

#[sqlx::test(migrations = false)]
async fn dedup_by_key_merges_the_same_fact(pool: PgPool) {
    common::migrate(&pool).await;
    let mut a = fact("u", "John is my cofounder", &["person:John"]);
    a.source_message_ids = vec!["m1".into()];
    let mut b = fact("u", "john is my  cofounder.", &["person:john"]);
    b.source_message_ids = vec!["m2".into()];
    b.valid_from = a.valid_from + Duration::seconds(5);
    let first = store::upsert(&pool, a).await.unwrap();
    let second = store::upsert(&pool, b).await.unwrap();
    assert!(matches!(first, Upserted::Inserted { .. }));
    assert_eq!(second, Upserted::Merged { id: first.id() });
    assert_eq!(count(&pool, "SELECT count(*) FROM memories").await, 1);
    let ids: Vec<String> = sqlx::query_scalar("SELECT source_message_ids FROM memories")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(ids, vec!["m1".to_string(), "m2".into()]);
    let key: String = sqlx::query_scalar("SELECT memory_key FROM memories")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(key, "people|person|john|relationship");
}

#[sqlx::test(migrations = false)]
async fn concurrent_same_key_writes_lose_nothing_and_end_deterministically(pool: PgPool) {
    common::migrate(&pool).await;
    let base = at("2024-01-01T00:00:00Z");
    let mut tasks = Vec::new();
    // Spawned in reverse time order so arrival order and validity order disagree.
    for i in (0..16).rev() {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut m = fact(
                "u",
                &format!("Sam works at company number {i}"),
                &["person:sam"],
            );
            m.valid_from = base + Duration::days(i);
            store::upsert(&pool, m).await
        }));
    }
    for t in tasks {
        t.await.unwrap().expect("no write fails");
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM memories").await, 16);
    let current: Vec<String> =
        sqlx::query_scalar("SELECT text FROM memories WHERE valid_to IS NULL")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(current, vec!["Sam works at company number 15".to_string()]);
    // The history is a chain: each version ends where the next begins.
    let gaps = count(
        &pool,
        "SELECT count(*) FROM (SELECT valid_to, lead(valid_from) OVER (ORDER BY valid_from) AS nxt
           FROM memories) x WHERE valid_to IS DISTINCT FROM nxt",
    )
    .await;
    assert_eq!(gaps, 0);
}

#[sqlx::test(migrations = false)]
async fn supersede_keeps_history_and_as_of_reads_it(pool: PgPool) {
    common::migrate(&pool).await;
    let mut v1 = fact("u", "Mia lives in Berlin", &["person:mia"]);
    v1.valid_from = at("2023-01-01T00:00:00Z");
    let mut v2 = fact("u", "Mia lives in Madrid", &["person:mia"]);
    v2.valid_from = at("2024-01-01T00:00:00Z");
    store::upsert(&pool, v1).await.unwrap();
    let up = store::upsert(&pool, v2).await.unwrap();
    assert!(matches!(up, Upserted::Versioned { .. }));
    let now = store::facts(&pool, &Scope::user("u"), None, 10)
        .await
        .unwrap();
    assert_eq!(
        now.iter().map(|f| f.text.as_str()).collect::<Vec<_>>(),
        vec!["Mia lives in Madrid"]
    );
    let then = store::facts(
        &pool,
        &Scope::user("u"),
        Some(at("2023-06-01T00:00:00Z")),
        10,
    )
    .await
    .unwrap();
    assert_eq!(
        then.iter().map(|f| f.text.as_str()).collect::<Vec<_>>(),
        vec!["Mia lives in Berlin"]
    );
    let old_to: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT valid_to FROM memories WHERE text = 'Mia lives in Berlin'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(old_to, Some(at("2024-01-01T00:00:00Z")));
}

#[sqlx::test(migrations = false)]
async fn keep_80_archives_oldest_and_never_pinned(pool: PgPool) {
    common::migrate(&pool).await;
    let base = at("2024-01-01T00:00:00Z");
    for i in 0..2 {
        let mut p = NewMemory::new(
            "u",
            Kind::Profile,
            FactType::Profile,
            &format!("pinned fact {i}"),
            Source::Explicit,
        );
        p.pinned = true;
        p.importance = 0;
        p.valid_from = base - Duration::days(100);
        store::upsert(&pool, p).await.unwrap();
    }
    for i in 0..85 {
        let mut m = NewMemory::new(
            "u",
            Kind::Profile,
            FactType::Preference,
            &format!("likes thing {i}"),
            Source::Extraction,
        );
        m.valid_from = base + Duration::hours(i);
        store::upsert(&pool, m).await.unwrap();
    }
    let mut other = NewMemory::new(
        "v",
        Kind::Profile,
        FactType::Preference,
        "other user's fact",
        Source::Extraction,
    );
    other.valid_from = base - Duration::days(1000);
    store::upsert(&pool, other).await.unwrap();
    assert_eq!(store::archive_keep(&pool, "u", 80, 120).await.unwrap(), 5);
    let archived: Vec<String> = sqlx::query_scalar(
        "SELECT text FROM memories WHERE status = 'ARCHIVED' ORDER BY valid_from",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        archived,
        (0..5)
            .map(|i| format!("likes thing {i}"))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memories WHERE pinned AND status = 'ACTIVE' AND importance = 3"
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memories WHERE user_id = 'v' AND status = 'ACTIVE'"
        )
        .await,
        1
    );
}

#[sqlx::test(migrations = false)]
async fn entity_cards_follow_seed_001(pool: PgPool) {
    common::migrate(&pool).await;
    let base = at("2024-01-01T00:00:00Z");
    let rows = [
        (
            "John is my cofounder",
            2,
            false,
            0,
            Kind::People,
            FactType::Relationship,
        ),
        (
            "John handles the backend",
            2,
            false,
            1,
            Kind::People,
            FactType::Project,
        ),
        (
            "John likes sushi",
            1,
            false,
            2,
            Kind::People,
            FactType::Preference,
        ),
        (
            "John lives in Austin",
            3,
            false,
            3,
            Kind::People,
            FactType::Profile,
        ),
        // Another kind, so its key differs from "plays chess" (seed 001's key is per
        // kind, entity and fact type).
        (
            "John's birthday is in May",
            0,
            true,
            4,
            Kind::Profile,
            FactType::Other,
        ),
        (
            "John plays chess",
            2,
            false,
            5,
            Kind::People,
            FactType::Other,
        ),
    ];
    for (text, imp, pinned, h, kind, ft) in rows {
        let mut m = NewMemory::new("u", kind, ft, text, Source::Extraction);
        m.entity_refs = vec!["person:john".into()];
        m.importance = imp;
        m.pinned = pinned;
        m.valid_from = base + Duration::hours(h);
        store::upsert(&pool, m).await.unwrap();
    }
    let cs = cards::cards_for_refs(&pool, &Scope::user("u"), Some(&["person:john".to_string()]))
        .await
        .unwrap();
    assert_eq!(cs.len(), 1);
    // pinned first, then importance 3, then importance 2 newest (chess, created last).
    assert_eq!(
        cs[0].text,
        "[person:john]: John's birthday is in May; John lives in Austin; John plays chess"
    );
    let none = cards::cards_for_refs(
        &pool,
        &Scope::user("other"),
        Some(&["person:john".to_string()]),
    )
    .await
    .unwrap();
    assert!(none.is_empty());
    let found = cards::foundation(&pool, &Scope::user("u")).await.unwrap();
    assert_eq!(found.len(), 1);
}

#[sqlx::test(migrations = false)]
async fn entity_merges_resolve_both_spellings(pool: PgPool) {
    common::migrate(&pool).await;
    let mut a = fact("u", "Makesh is my manager", &["person:makesh"]);
    a.importance = 2;
    let mut b = fact("u", "Mukesh runs the Tuesday standup", &["person:mukesh"]);
    b.kind = Kind::Project;
    b.importance = 2;
    store::upsert(&pool, a).await.unwrap();
    store::upsert(&pool, b).await.unwrap();
    store::upsert(
        &pool,
        fact("u2", "Mikesh is someone else", &["person:mikesh"]),
    )
    .await
    .unwrap();
    let props = store::propose_merges(&pool, "u", 0.4).await.unwrap();
    assert_eq!(props.len(), 1, "{props:?}");
    let p = &props[0];
    store::merge_entities(&pool, "u", &p.alias, &p.canonical, Some(p.similarity))
        .await
        .unwrap();
    for spelling in ["person:makesh", "person:mukesh"] {
        let cs = cards::cards_for_refs(&pool, &Scope::user("u"), Some(&[spelling.to_string()]))
            .await
            .unwrap();
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].facts.len(), 2, "{spelling}: {:?}", cs[0]);
    }
}

#[sqlx::test(migrations = false)]
async fn remember_and_forget_report_found_and_not_found(pool: PgPool) {
    let svc = service(&pool).await;
    let job: i64 =
        sqlx::query_scalar("SELECT kvmem_remember('u', NULL, 'my sister Ana lives in Lisbon')")
            .fetch_one(&pool)
            .await
            .unwrap();
    let out = jobs::drain(&svc).await.unwrap();
    assert!(
        matches!(&out[..], [Outcome::Done { job_id, .. }] if *job_id == job),
        "{out:?}"
    );
    let (pinned, source, imp): (bool, String, i16) =
        sqlx::query_as("SELECT pinned, source, importance FROM memories WHERE user_id = 'u'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(pinned && source == "explicit" && imp == 3);
    let blob: String = sqlx::query_scalar("SELECT blob FROM memory_blobs WHERE user_id = 'u'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(blob, "The user's sister Ana lives in Lisbon.");

    let miss: i64 =
        sqlx::query_scalar("SELECT kvmem_forget('u', NULL, 'my favourite colour is green')")
            .fetch_one(&pool)
            .await
            .unwrap();
    jobs::drain(&svc).await.unwrap();
    let r: serde_json::Value = sqlx::query_scalar("SELECT result FROM memory_jobs WHERE id = $1")
        .bind(miss)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(r["found"], false);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memories WHERE status = 'ACTIVE'"
        )
        .await,
        1
    );

    // Another user's forget never touches u's facts.
    sqlx::query("SELECT kvmem_forget('intruder', NULL, 'sister Ana lives in Lisbon')")
        .execute(&pool)
        .await
        .unwrap();
    jobs::drain(&svc).await.unwrap();
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memories WHERE status = 'ACTIVE'"
        )
        .await,
        1
    );

    let hit: i64 = sqlx::query_scalar("SELECT kvmem_forget('u', NULL, 'Ana lives in Lisbon')")
        .fetch_one(&pool)
        .await
        .unwrap();
    jobs::drain(&svc).await.unwrap();
    let r: serde_json::Value = sqlx::query_scalar("SELECT result FROM memory_jobs WHERE id = $1")
        .bind(hit)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(r["found"], true);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memories WHERE status = 'ACTIVE'"
        )
        .await,
        0
    );

    let bad = sqlx::query("SELECT kvmem_remember('u', NULL, '  ')")
        .execute(&pool)
        .await;
    assert!(bad
        .unwrap_err()
        .to_string()
        .contains("at least 3 characters"));
}

#[sqlx::test(migrations = false)]
async fn missing_embedder_degrades_to_lexical(pool: PgPool) {
    common::migrate(&pool).await;
    let svc = kvmem::system::memory_service_loading(
        pool.clone(),
        config(Some(PathBuf::from("/nonexistent/minilm.gguf"))),
    )
    .await;
    assert!(svc.embedder.is_none());
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM events WHERE kind = 'memory_embedder_unavailable'"
        )
        .await,
        1
    );
    let rep = import_fixture(&svc).await;
    assert_eq!((rep.imported, rep.embedded, rep.semantic), (5, 0, false));
    let res = search::search(&svc, &req("alice", "puppy Biscuit", RankerKind::Hybrid))
        .await
        .unwrap();
    assert!(!res.semantic);
    assert_eq!(res.hits[0].source_message_ids, vec!["a-3".to_string()]);
    // A later run with the model backfills the vectors.
    let full = service(&pool).await;
    let again = import_fixture(&full).await;
    assert_eq!(
        (again.imported, again.skipped_duplicate, again.backfilled),
        (0, 5, 5)
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_messages WHERE embedding IS NULL"
        )
        .await,
        0
    );
}
