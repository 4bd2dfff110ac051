//! A search only reads: a batch of searches over a history whose messages and facts have
//! no vector changes no row of any table (Postgres' own per-table counters), and the memory
//! lane, not the search, gives those rows their vectors, one user at a time.

use super::*;

use std::collections::BTreeMap;

type Writes = BTreeMap<String, (i64, i64, i64)>;

/// Rows inserted, updated and deleted per table of the database, as Postgres counts them.
/// `writer` is the one connection every write of the test goes through: its pending
/// counters are flushed before the reply comes, so the figures are complete.
async fn writes(writer: &PgPool, reader: &PgPool) -> Writes {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(writer)
        .await
        .unwrap();
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables",
    )
    .fetch_all(reader)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(t, i, u, d)| (t, (i, u, d)))
        .collect()
}

#[sqlx::test(migrations = false)]
async fn a_batch_of_searches_writes_no_row_and_the_lane_fills_the_vectors(pool: PgPool) {
    // One connection for everything that may write, so its counters flush in order.
    let one = kvmem::system::connect_url(&common::db_url(&pool).await, 1)
        .await
        .unwrap();
    common::migrate(&one).await;
    let lexical = kvmem::system::memory_service_on(one.clone(), config(None), None);
    let before_import = writes(&one, &pool).await;
    let report = import_fixture(&lexical).await;
    assert_eq!(report.embedded, 0, "imported without an embedder");
    store::upsert(
        &one,
        fact("alice", "Ana bakes bread in Porto", &["person:ana"]),
    )
    .await
    .unwrap();
    store::upsert(
        &one,
        fact("bob", "Rui collects antique maps", &["person:rui"]),
    )
    .await
    .unwrap();
    let before = writes(&one, &pool).await;
    // The counters see writes: the import's rows are counted.
    let inserted = |w: &Writes| w.get("memory_messages").map_or(0, |x| x.0);
    assert_eq!(
        inserted(&before) - inserted(&before_import),
        report.imported as i64
    );

    let svc = kvmem::system::memory_service_on(
        one.clone(),
        config(Some(default_embedder())),
        Some(embedder()),
    );
    let alice_messages = count(
        &one,
        "SELECT count(*) FROM memory_messages WHERE user_id = 'alice'",
    )
    .await;
    let rankers = [
        RankerKind::Hybrid,
        RankerKind::Weighted,
        RankerKind::RecencyImportance,
        RankerKind::Vector,
        RankerKind::Lexical,
    ];
    let mut searches = 0;
    for ranker in rankers {
        for q in [
            "where did my sister move",
            "Porto bakery",
            "the puppy",
            "last June",
        ] {
            let res = search::search(&svc, &req("alice", q, ranker))
                .await
                .unwrap();
            assert_eq!(res.without_vector, alice_messages, "{ranker:?} {q}");
            if ranker != RankerKind::Lexical {
                assert!(res.semantic, "{ranker:?} {q}");
                assert_eq!(res.facts_without_vector, 1, "{ranker:?} {q}");
            }
            searches += 1;
        }
    }
    // The lexical legs still find the vectorless rows.
    let res = search::search(&svc, &req("alice", "Porto bakery", RankerKind::Hybrid))
        .await
        .unwrap();
    assert!(res.hits.iter().any(|h| h.source_message_ids == ["a-1"]));
    assert_eq!(searches, 20);
    assert_eq!(writes(&one, &pool).await, before, "a search wrote a row");

    // The lane embeds what the searches left: alice's job fills alice's rows only.
    let mid: i64 = sqlx::query_scalar(
        "SELECT id FROM memory_messages WHERE user_id = 'alice' AND message_id = 'a-1'",
    )
    .fetch_one(&one)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO memory_jobs (user_id, kind, memory_message_id) VALUES ('alice', 'ingest', $1)",
    )
    .bind(mid)
    .execute(&one)
    .await
    .unwrap();
    let done = jobs::process_next_memory_job(&svc).await.unwrap();
    assert!(matches!(done, Outcome::Done { .. }), "{done:?}");
    let vectorless = |user: &'static str| {
        let one = one.clone();
        async move {
            let m = count(&one, &format!("SELECT count(*) FROM memory_messages WHERE user_id = '{user}' AND embedding IS NULL")).await;
            let f = count(
                &one,
                &format!(
                    "SELECT count(*) FROM memories WHERE user_id = '{user}' AND embedding IS NULL"
                ),
            )
            .await;
            (m, f)
        }
    };
    assert_eq!(vectorless("alice").await, (0, 0));
    let bob_messages = count(
        &one,
        "SELECT count(*) FROM memory_messages WHERE user_id = 'bob'",
    )
    .await;
    assert_eq!(vectorless("bob").await, (bob_messages, 1));
    let res = search::search(
        &svc,
        &req("alice", "where did my sister move", RankerKind::Hybrid),
    )
    .await
    .unwrap();
    assert_eq!((res.without_vector, res.facts_without_vector), (0, 0));
}
