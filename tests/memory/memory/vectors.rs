//! The vector legs: per-user statistics, the HNSW index, one embedder per process, spans and voices.

use super::*;
use crate::sessions::{import_session, POTTERY};

/// BM25's statistics, the speakers a question can name and the neighbours of a hit are
/// one user's own: another user's dialogue, however much of it shares the query's words,
/// changes neither which of this user's messages come back nor their scores.
#[sqlx::test(migrations = false)]
async fn another_users_dialogue_never_moves_a_search(pool: PgPool) {
    let svc = service(&pool).await;
    import_fixture(&svc).await;
    let query = "Where did Alice's sister Ana move for the bakery job?";
    let run = || async {
        let mut out = Vec::new();
        for ranker in [RankerKind::Hybrid, RankerKind::Lexical] {
            let res = search::search(&svc, &req("alice", query, ranker))
                .await
                .unwrap();
            out.push(
                res.hits
                    .iter()
                    .map(|h| (h.id.clone(), h.score.to_bits()))
                    .collect::<Vec<_>>(),
            );
        }
        out
    };
    let before = run().await;
    assert!(before.iter().all(|hits| !hits.is_empty()), "{before:?}");
    import_carol(&svc, 120, |i| {
        (
            if i % 2 == 0 { "Alice" } else { "Ana" },
            format!("Ana moved to Porto for the bakery job, my sister says, day {i}"),
        )
    })
    .await;
    assert_eq!(run().await, before, "carol's dialogue moved alice's search");
    let carol = search::search(&svc, &req("carol", query, RankerKind::Hybrid))
        .await
        .unwrap();
    assert!(
        carol.hits.iter().all(|h| h.id.starts_with("c-")),
        "{carol:?}"
    );
}

/// A user above `exact_search_max` is searched through the HNSW index: on a small history
/// the index returns what the exact scan returns, in the same order with the same scores,
/// and never a row of the user sharing the table.
#[sqlx::test(migrations = false)]
async fn the_vector_index_finds_what_the_exact_scan_finds_and_keeps_the_wall(pool: PgPool) {
    let exact = service(&pool).await;
    import_fixture(&exact).await;
    import_carol(&exact, 200, |i| {
        (
            "Carol",
            format!("My sister moved to Porto with her beagle puppy, note {i}"),
        )
    })
    .await;
    let mut index = exact.clone();
    index.config.exact_search_max = 0;
    // The hybrid ranker adds the span leg and, for a question naming Alice, the voiced
    // question's leg: both go through their index too.
    for (query, ranker) in [
        ("where did my sister move", RankerKind::Vector),
        ("new family dog", RankerKind::Vector),
        ("the bakery job", RankerKind::Vector),
        ("where did my sister move", RankerKind::Hybrid),
        (
            "What did Alice say about the new family dog?",
            RankerKind::Hybrid,
        ),
    ] {
        let a = search::search(&exact, &req("alice", query, ranker))
            .await
            .unwrap();
        let b = search::search(&index, &req("alice", query, ranker))
            .await
            .unwrap();
        let ids = |r: &search::SearchResponse| {
            r.hits
                .iter()
                .map(|h| (h.id.clone(), h.score.to_bits()))
                .collect::<Vec<_>>()
        };
        assert!(!a.hits.is_empty(), "{query}");
        assert_eq!(ids(&a), ids(&b), "{query}");
        assert!(b.hits.iter().all(|h| h.id.starts_with("a-")), "{b:?}");
    }
    // The index path's statement, under the settings the search gives it, reads the index.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(include_str!("../../../sql/memory/hnsw_settings.sql"))
        .bind("200")
        .execute(&mut *tx)
        .await
        .unwrap();
    let q = pgvector::Vector::from(vec![0.05_f32; 384]);
    let plan: serde_json::Value = sqlx::query_scalar(&format!(
        "EXPLAIN (FORMAT JSON) {}",
        include_str!("../../../sql/memory/search_messages_vectors.sql")
    ))
    .bind("alice")
    .bind(None::<i64>)
    .bind(None::<String>)
    .bind(None::<chrono::DateTime<chrono::Utc>>)
    .bind(&q)
    .bind(100_i64)
    .bind(exact.model_id().expect("an embedder"))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert!(
        plan.to_string().contains("memory_messages_embedding_hnsw"),
        "{plan}"
    );
}

/// Every memory service of a process shares one loaded embedder: the CLI, the pipeline
/// and the lanes each build a service, and the model is loaded once.
#[sqlx::test(migrations = false)]
async fn two_services_and_their_searches_load_the_embedder_once(pool: PgPool) {
    common::migrate(&pool).await;
    // A path of this test's own, so no other test of the binary loads it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("embedder.gguf");
    std::os::unix::fs::symlink(default_embedder(), &path).unwrap();
    let a = kvmem::system::memory_service_loading(pool.clone(), config(Some(path.clone()))).await;
    let b = kvmem::system::memory_service_loading(pool.clone(), config(Some(path.clone()))).await;
    import_fixture(&a).await;
    for svc in [&a, &b] {
        let res = search::search(svc, &req("alice", "new family dog", RankerKind::Hybrid))
            .await
            .unwrap();
        assert!(res.semantic);
    }
    assert_eq!(kvmem::memory::embed::loads(&path), 1);
    assert!(Arc::ptr_eq(
        a.embedder.as_ref().unwrap(),
        b.embedder.as_ref().unwrap()
    ));
}

/// One process, wired by the composition root: two searches (the CLI's and the HTTP API's
/// way in) and a turn (whose pipeline builds its own memory service for recall) load the
/// embedder once and open one pool.
#[sqlx::test(migrations = false)]
async fn two_searches_and_a_turn_load_the_embedder_once_and_open_one_pool(pool: PgPool) {
    let url = common::db_url(&pool).await;
    // A path of this test's own, so no other test of the binary loads it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("embedder.gguf");
    std::os::unix::fs::symlink(default_embedder(), &path).unwrap();
    let settings = common::settings(serde_json::json!({
        "database_url": url,
        "memory_embed_model_path": path,
    }));
    let settings = Arc::new(settings);
    let writer = kvmem::system::Role::Writer { connections: 4 };
    let app = kvmem::system::build(settings.clone(), writer)
        .await
        .unwrap();
    let db = app.pool.clone();
    let ch = common::character(&db, "alice", "Aria").await;
    for _ in 0..2 {
        let svc = kvmem::system::memory_service(db.clone(), &settings, true)
            .await
            .unwrap();
        let res = search::search(&svc, &req("alice", "new family dog", RankerKind::Hybrid))
            .await
            .unwrap();
        assert!(res.semantic, "the search ran without its embedder");
    }
    let engine = common::load_engine(&common::tiny_model(), &settings);
    let deps = app
        .with_metrics(Arc::new(kvmem::metrics::Metrics::new()))
        .deps(kvmem::system::Model::Llama(engine), "w1".into())
        .unwrap();
    let (id, log) = common::one_turn(&deps, "s1", "alice", ch, "what about my dog?").await;
    assert!(log.error.is_none(), "{log:?}");
    // The turn's recall ran (its search embeds the question), so the pipeline built its
    // memory service.
    let recall_ms: i32 = sqlx::query_scalar("SELECT recall_ms FROM turn_log WHERE turn_id = $1")
        .bind(id.0)
        .fetch_one(&db)
        .await
        .unwrap();
    assert!(recall_ms > 0, "recall did not run");
    assert_eq!(kvmem::memory::embed::loads(&path), 1);
    assert_eq!(kvmem::system::pools_opened(&url), 1);
}

/// The import gives every message its span vector (the message and the four before it in
/// its session, oldest first), and a turn that shares no word with the question is found
/// through the span that holds the question's topic.
#[sqlx::test(migrations = false)]
async fn spans_are_embedded_at_import_and_carry_a_topic_to_its_turns(pool: PgPool) {
    let svc = service(&pool).await;
    let report = import_session(&svc, "dana", POTTERY).await;
    assert_eq!(report.spans_embedded, POTTERY.len());
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_messages WHERE span_embedding IS NULL"
        )
        .await,
        0
    );
    // Both vectors stay in the row: an exact scan reads no TOAST chunk for them (with
    // the default 2 KB target, one chunk per message).
    let toast: String = sqlx::query_scalar(
        "SELECT reltoastrelid::regclass::text FROM pg_class \
          WHERE oid = 'memory_messages'::regclass",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let chunks = count(&pool, &format!("SELECT count(*) FROM {toast}")).await;
    assert_eq!(chunks, 0, "vectors moved out of the row");
    // The span of the fifth turn ("Send pictures!!") is turns one to five, oldest first.
    let text: Vec<String> = POTTERY[..5]
        .iter()
        .map(|(s, t)| format!("{s}: {t}"))
        .collect();
    let want = embedder()
        .embed(&[text.join(" ")], Role::Passage)
        .unwrap()
        .remove(0);
    let stored: pgvector::Vector = sqlx::query_scalar(
        "SELECT span_embedding FROM memory_messages WHERE message_id = 'dana-4'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let cos: f32 = want.iter().zip(stored.as_slice()).map(|(a, b)| a * b).sum();
    assert!(
        cos > 0.9999,
        "span vector differs from its text's: cosine {cos}"
    );

    let res = search::search(
        &svc,
        &req(
            "dana",
            "What did Dana make in the ceramics course?",
            RankerKind::Hybrid,
        ),
    )
    .await
    .unwrap();
    let answer = res
        .hits
        .iter()
        .find(|h| h.id == "dana-3")
        .expect("the answer turn");
    assert!(answer.components.span.unwrap_or(0.0) > 0.0, "{answer:?}");
    let plumber = res.hits.iter().find(|h| h.id == "dana-1");
    assert!(
        plumber.is_none_or(|p| p.score < answer.score),
        "{:?}",
        res.hits
    );
}

/// A span longer than the embedder's window is cut at its oldest turns, not at its own
/// message: after four long turns about bread, the short turn that ends the span still
/// shapes its vector.
#[sqlx::test(migrations = false)]
async fn a_long_span_keeps_its_own_message(pool: PgPool) {
    let svc = service(&pool).await;
    let once = "The sourdough starter needs feeding twice a day with rye flour and warm water, \
                 then the dough rests overnight in the fridge, gets folded four times, shaped \
                 into a round loaf, scored with a razor and baked in a cast iron pot at high heat \
                 for forty minutes with the lid on and twenty more with it off. Then it cools \
                 on a rack for an hour before anyone is allowed to cut it.";
    // Twice over: the span must pass e5-small's window (512) as well as MiniLM's (256).
    let twice = format!("{once} {once}");
    let bread = twice.as_str();
    let last = "Oh and my sister Maya just started as a nurse at the hospital in Lisbon.";
    let lines: Vec<(&str, &str)> = vec![
        ("Pri", bread),
        ("Dana", bread),
        ("Pri", bread),
        ("Dana", bread),
        ("Pri", last),
    ];
    import_session(&svc, "dana", &lines).await;
    let all: Vec<String> = lines.iter().map(|(s, t)| format!("{s}: {t}")).collect();
    // The span must not fit, or the test shows nothing.
    let words: usize = all.iter().map(|l| l.split_whitespace().count()).sum();
    assert!(words > embedder().window(), "{words} words fit the window");
    let span = |id: &'static str| {
        let pool = pool.clone();
        async move {
            let v: pgvector::Vector = sqlx::query_scalar(
                "SELECT span_embedding FROM memory_messages WHERE message_id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
            v.to_vec()
        }
    };
    let dot = |a: &[f32], b: &[f32]| -> f32 { a.iter().zip(b).map(|(x, y)| x * y).sum() };
    // The turn before it has the four bread turns as its span. Cut at the start, both
    // spans would be the same first window of bread, and so the same vector.
    let (with_it, before_it) = (span("dana-4").await, span("dana-3").await);
    // Identical inputs embed to the same vector (cosine 1 to float error); e5's cosines sit
    // high for any two texts, so the margin to 1 is small but not noise.
    let same = dot(&with_it, &before_it);
    assert!(same < 0.999, "the two spans embed alike: cosine {same}");
    let alone = embedder()
        .embed(&[format!("Pri: {last}")], Role::Passage)
        .unwrap()
        .remove(0);
    let (mine, theirs) = (dot(&alone, &with_it), dot(&alone, &before_it));
    assert!(
        mine > theirs + 0.03,
        "the message is no nearer its own span ({mine}) than the span before it ({theirs})"
    );
}

/// A question that names one speaker scores that speaker's turns by the question in their
/// own voice, and only theirs: the other speaker's turns carry no voice component.
#[sqlx::test(migrations = false)]
async fn the_named_speakers_turns_alone_are_scored_in_their_voice(pool: PgPool) {
    let svc = service(&pool).await;
    import_session(
        &svc,
        "dana",
        &[
            (
                "Dana",
                "I paid $350 for my wheel, secondhand from a retired teacher.",
            ),
            ("Pri", "Wheels cost a fortune, I bet Dana's was pricey."),
            ("Dana", "Worth every cent though."),
        ],
    )
    .await;
    let res = search::search(
        &svc,
        &req(
            "dana",
            "How much did Dana's pottery wheel cost?",
            RankerKind::Hybrid,
        ),
    )
    .await
    .unwrap();
    // Dana's own statement outranks Pri's guess, which shares more of the question's words
    // but is not in Dana's voice.
    let rank_of = |id: &str| res.hits.iter().position(|h| h.id == id);
    assert!(
        rank_of("dana-0").expect("Dana's statement is found")
            < rank_of("dana-1").unwrap_or(usize::MAX),
        "{:?}",
        res.hits
    );
    for h in &res.hits {
        let voiced = h.components.voice.is_some();
        assert_eq!(voiced, h.speaker.as_deref() == Some("Dana"), "{h:?}");
    }
    // Naming both speakers prefers neither.
    let both = search::search(
        &svc,
        &req(
            "dana",
            "What did Pri and Dana say about the wheel?",
            RankerKind::Hybrid,
        ),
    )
    .await
    .unwrap();
    assert!(
        both.hits.iter().all(|h| h.components.voice.is_none()),
        "{:?}",
        both.hits
    );
}

/// A 768-wide embedder (EmbeddingGemma) keeps its vectors in their own columns beside the
/// 384-wide ones: before a reindex its searches fall back to the lexical legs and write
/// nothing; a reindex fills its columns and leaves e5's vectors and e5's searches exactly
/// as they were; its index returns what its exact scan does, and neither ever returns
/// another user's row.
#[sqlx::test(migrations = false)]
async fn a_wider_embedder_has_columns_of_its_own_and_keeps_the_wall(pool: PgPool) {
    let Some(gemma_path) = crate::embedder::gemma_path() else {
        return;
    };
    let e5 = service(&pool).await;
    import_fixture(&e5).await;
    import_carol(&e5, 120, |i| {
        (
            "Carol",
            format!("My sister moved to Porto with her beagle puppy, note {i}"),
        )
    })
    .await;
    let query = "where did my sister move";
    let e5_hits = || async {
        search::search(&e5, &req("alice", query, RankerKind::Hybrid))
            .await
            .unwrap()
            .hits
            .iter()
            .map(|h| (h.id.clone(), h.score.to_bits()))
            .collect::<Vec<_>>()
    };
    let e5_before = e5_hits().await;
    let narrow = "SELECT count(*) FROM memory_messages WHERE embedding IS NOT NULL";
    let wide = "SELECT count(*) FROM memory_messages WHERE embedding_768 IS NOT NULL";
    let narrow_before = count(&pool, narrow).await;
    assert!(narrow_before > 120, "{narrow_before}");

    let gemma_embedder = Embedder::shared(&gemma_path, 1).expect("load EmbeddingGemma");
    assert_eq!(gemma_embedder.dims, 768);
    let gemma = kvmem::system::memory_service_on(
        pool.clone(),
        config(Some(gemma_path)),
        Some(gemma_embedder),
    );
    let lexical_only = search::search(&gemma, &req("alice", query, RankerKind::Hybrid))
        .await
        .unwrap();
    assert!(lexical_only.without_vector > 0, "{lexical_only:?}");
    assert_eq!(count(&pool, wide).await, 0, "a search wrote a vector");

    let wrote = import::reindex(&gemma, None, false).await.unwrap();
    assert!(wrote > 0);
    assert_eq!(count(&pool, wide).await, narrow_before);
    assert_eq!(count(&pool, narrow).await, narrow_before);
    assert_eq!(
        e5_hits().await,
        e5_before,
        "gemma's reindex moved e5's search"
    );

    let mut index = gemma.clone();
    index.config.exact_search_max = 0;
    for (user, prefix) in [("alice", "a-"), ("carol", "c-")] {
        for ranker in [RankerKind::Vector, RankerKind::Hybrid] {
            let a = search::search(&gemma, &req(user, query, ranker))
                .await
                .unwrap();
            let b = search::search(&index, &req(user, query, ranker))
                .await
                .unwrap();
            assert_eq!(a.without_vector, 0, "{a:?}");
            assert!(!a.hits.is_empty(), "{user} {ranker:?}");
            let ids = |r: &search::SearchResponse| {
                r.hits
                    .iter()
                    .map(|h| (h.id.clone(), h.score.to_bits()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(ids(&a), ids(&b), "{user} {ranker:?}");
            assert!(
                b.hits.iter().all(|h| h.id.starts_with(prefix)),
                "{user}: {b:?}"
            );
        }
    }
    // The wide statement, under the index settings, reads the wide index.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(include_str!("../../../sql/memory/hnsw_settings.sql"))
        .bind("200")
        .execute(&mut *tx)
        .await
        .unwrap();
    let q = pgvector::Vector::from(vec![0.03_f32; 768]);
    let plan: serde_json::Value = sqlx::query_scalar(&format!(
        "EXPLAIN (FORMAT JSON) {}",
        kvmem::memory::columns::Columns::WIDE.sql(include_str!(
            "../../../sql/memory/search_messages_vectors.sql"
        ))
    ))
    .bind("alice")
    .bind(None::<i64>)
    .bind(None::<String>)
    .bind(None::<chrono::DateTime<chrono::Utc>>)
    .bind(&q)
    .bind(100_i64)
    .bind(gemma.model_id().expect("an embedder"))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert!(
        plan.to_string()
            .contains("memory_messages_embedding_768_hnsw"),
        "{plan}"
    );
}

/// After a switch of embedder, the worker's idle re-embed gives every stored message, span
/// and fact a vector of the new model a step at a time, of every user, without touching
/// the old model's vectors; a pass that reaches the end is done and writes nothing more.
#[sqlx::test(migrations = false)]
async fn the_idle_re_embed_fills_the_new_models_columns_and_stops(pool: PgPool) {
    let Some(gemma_path) = crate::embedder::gemma_path() else {
        return;
    };
    let e5 = service(&pool).await;
    import_fixture(&e5).await;
    import_carol(&e5, 20, |i| ("Carol", format!("Porto trip note {i}"))).await;
    let mut f = fact("alice", "Alice's sister Ana moved to Porto", &[]);
    e5.embed_memory(&mut f).await;
    store::upsert(&pool, f).await.unwrap();
    let messages = count(&pool, "SELECT count(*) FROM memory_messages").await;
    let e5_vectors = "SELECT count(*) FROM memory_messages WHERE embedding IS NOT NULL \
                      AND span_embedding IS NOT NULL";
    let e5_before = count(&pool, e5_vectors).await;
    assert!(e5_before > 20, "{e5_before}");

    let gemma = kvmem::system::memory_service_on(
        pool.clone(),
        config(Some(gemma_path.clone())),
        Some(Embedder::shared(&gemma_path, 1).expect("load EmbeddingGemma")),
    );
    let model = gemma.model_id().unwrap().to_string();
    let mut reembed = backfill::Reembed::default();
    let (mut steps, mut stored) = (0, 0);
    while !reembed.is_done() {
        stored += reembed.step(&gemma).await.unwrap();
        steps += 1;
        assert!(steps < 100, "the re-embed never ended");
    }
    // Every message and span, and the fact, once each.
    assert_eq!(stored as i64, 2 * messages + 1);
    assert!(steps > 2, "{steps} steps: the messages came in one step");
    let wide: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM memory_messages WHERE embed_model_768 = $1 \
         AND span_embed_model_768 = $1 AND vector_dims(embedding_768) = 768",
    )
    .bind(&model)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(wide, messages);
    let facts: i64 = sqlx::query_scalar("SELECT count(*) FROM memories WHERE embed_model = $1")
        .bind(&model)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(facts, 1);
    assert_eq!(
        count(&pool, e5_vectors).await,
        e5_before,
        "e5's vectors were touched"
    );
    assert_eq!(reembed.step(&gemma).await.unwrap(), 0);
    let s = search::search(
        &gemma,
        &req("alice", "where did Ana move", RankerKind::Hybrid),
    )
    .await
    .unwrap();
    assert_eq!((s.without_vector, s.facts_without_vector), (0, 0), "{s:?}");
}
