//! Rankers against hand-computed scores, paraphrase, time, the CLI's JSON and the wall between users.

use super::*;

/// A search's query goes through the embedder's one-thread context, stored messages through
/// the batch context on every thread: the query must land where the same text stored does.
#[test]
fn a_query_embeds_as_the_same_text_does_in_a_batch() {
    let e = Embedder::load(&default_embedder(), 2).expect("load the embedder");
    let texts: Vec<String> = [
        "where is the kayak",
        "Ana said the guitar needs new strings before the concert",
        "we took the train to the museum in May",
    ]
    .map(String::from)
    .to_vec();
    let batch = e.embed(&texts, Role::Passage).unwrap();
    assert_eq!(batch.len(), texts.len());
    for (t, b) in texts.iter().zip(&batch) {
        let one = e
            .embed(std::slice::from_ref(t), Role::Passage)
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(one.len(), b.len());
        let worst = one
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-4, "{t}: differs by {worst}");
    }
}

#[test]
fn rankers_match_hand_computed_scores() {
    let now = at("2024-06-15T00:00:00Z");
    let a = Signals {
        semantic: Some(0.8),
        lexical: 0.5,
        confidence: 0.9,
        at: Some(now - Duration::days(14)),
        channel: 1.0,
        entity_freq: 0.5,
        lexical_rank: Some(0),
        vector_rank: Some(2),
        ..Signals::default()
    };
    // recency-importance: 0.40*0.8 + 0.30*0.5^(14/14) + 0.30*0.5 = 0.32 + 0.15 + 0.15 = 0.62
    assert!((rank::recency_importance(&a, now).score - 0.62).abs() < 1e-9);
    // weighted: recency 1/(1+14/45) = 0.7627118644;
    // 0.5*0.8 + 0.28*0.5 + 0.10*0.9 + 0.07*0.7627118644 + 0.05*1 = 0.7333898305
    let s = rank::weighted(&a, now);
    assert!((s.score - 0.7333898305).abs() < 1e-9, "{}", s.score);
    assert!(s.passes_gate);
    // No semantic: 0.75*0.5 + 0.10*0.9 + 0.10*0.7627118644 + 0.05*1 = 0.5912711864
    let no_sem = Signals {
        semantic: None,
        ..a.clone()
    };
    assert!((rank::weighted(&no_sem, now).score - 0.5912711864).abs() < 1e-9);
    // Weak lexical-only candidate: 0.75*0.2 + 0.10*0.5 + 0.10*1 + 0.05*0.25 = 0.3125,
    // below both gates (lexical 0.2 < 0.24, combined < 0.62).
    let b = Signals {
        lexical: 0.2,
        confidence: 0.5,
        at: Some(now),
        channel: 0.25,
        ..Signals::default()
    };
    let sb = rank::weighted(&b, now);
    assert!((sb.score - 0.3125).abs() < 1e-9);
    assert!(!sb.passes_gate);
    // hybrid, with the query's cosines at 0.5 ± 0.2 and its spans' at 0.4 ± 0.1: without a
    // span, BM25 or time, 0.15 * (0.8 - 0.5) / 0.2 + 0.3 * -2 (no span) = 0.225 - 0.6.
    let spreads = rank::Spreads {
        semantic: rank::Spread { mean: 0.5, sd: 0.2 },
        span: rank::Spread { mean: 0.4, sd: 0.1 },
    };
    assert!((rank::hybrid(&a, Some(&spreads)).score - -0.375).abs() < 1e-9);
    // Too few candidates to standardise over: the raw cosine alone, 0.8.
    assert!((rank::hybrid(&a, None).score - 0.8).abs() < 1e-9);
    // With all four: 0.225 + 0.3 * (0.6 - 0.4) / 0.1 + 0.25 * 0.5 + 2 * 1/(10+1+1)
    // = 0.225 + 0.6 + 0.125 + 0.1666666667; the components are the raw signals.
    let full = Signals {
        span: Some(0.6),
        bm25: 0.5,
        in_window: Some(true),
        window_rank: Some(1),
        ..a.clone()
    };
    let h = rank::hybrid(&full, Some(&spreads));
    assert!((h.score - 1.1166666667).abs() < 1e-9, "{}", h.score);
    assert_eq!(
        (h.components.semantic.unwrap(), h.components.span.unwrap()),
        (0.8, 0.6)
    );
    // In the named speaker's voice at 0.7: + 0.38 * (0.7 - 0.5) / 0.2 + 0.85.
    let voiced = Signals {
        voice: Some(0.7),
        ..full.clone()
    };
    assert!((rank::hybrid(&voiced, Some(&spreads)).score - 2.3466666667).abs() < 1e-9);
    // Raw: 0.8 + 1.5*0.6 + 0.1*0.5 + 2/12 + 0.8*0.7 = 2.4766666667
    assert!((rank::hybrid(&voiced, None).score - 2.4766666667).abs() < 1e-9);
    // Spreads: 0.2, 0.4, 0.6 -> 0.4 ± sqrt(0.08 / 3); nothing or one value -> sd 1.
    let s3 = rank::Spread::of([0.2, 0.4, 0.6].into_iter());
    assert!((s3.mean - 0.4).abs() < 1e-12 && (s3.sd - 0.1632993162).abs() < 1e-9);
    assert_eq!(rank::Spread::of([0.5].into_iter()).sd, 1.0);
    assert_eq!(rank::Spread::of(std::iter::empty()).mean, 0.0);
    // Entity frequency: refs {a}, {a,b}, {c}: counts a=2, b=1, c=1 -> 2/2, 2/2, 1/2.
    let f = rank::entity_frequency(&[
        vec!["a".into()],
        vec!["a".into(), "b".into()],
        vec!["c".into()],
    ]);
    assert_eq!(f, vec![1.0, 1.0, 0.5]);
}

#[sqlx::test(migrations = false)]
async fn weighted_no_semantic_scores_a_stored_message_by_hand(pool: PgPool) {
    common::migrate(&pool).await;
    let svc = kvmem::system::memory_service_loading(
        pool.clone(),
        config(Some(PathBuf::from("/nonexistent/minilm.gguf"))),
    )
    .await;
    assert!(svc.embedder.is_none());
    import_fixture(&svc).await;
    let res = search::search(&svc, &req("alice", "Ana Porto", RankerKind::Weighted))
        .await
        .unwrap();
    assert!(!res.semantic);
    let top = &res.hits[0];
    assert_eq!(top.source_message_ids, vec!["a-1".to_string()]);
    // The newest message of alice is the reference time.
    // a-1 at 2024-05-03T10:00, newest 2024-06-11T09:00: 38.9583 days.
    // lexical 1.0 (ana, porto), confidence 1.0, channel 0.25 (none):
    // 0.75 + 0.10 + 0.10/(1+38.9583333/45) + 0.0125 = 0.8625 + 0.10/1.8657407 = 0.8625 + 0.0535980
    assert!((top.score - 0.9160980).abs() < 1e-6, "{}", top.score);
}

#[sqlx::test(migrations = false)]
async fn paraphrase_is_found_by_vector(pool: PgPool) {
    let svc = service(&pool).await;
    import_fixture(&svc).await;
    // No word in common with "I adopted a beagle puppy named Biscuit."
    let res = search::search(&svc, &req("alice", "new family dog", RankerKind::Vector))
        .await
        .unwrap();
    assert!(res.semantic);
    assert_eq!(res.hits[0].source_message_ids, vec!["a-3".to_string()]);
    let res = search::search(&svc, &req("alice", "new family dog", RankerKind::Hybrid))
        .await
        .unwrap();
    assert_eq!(res.hits[0].source_message_ids, vec!["a-3".to_string()]);
}

#[sqlx::test(migrations = false)]
async fn tenants_are_walls(pool: PgPool) {
    let svc = service(&pool).await;
    import_fixture(&svc).await;
    for u in ["alice", "bob"] {
        let mut m = fact(u, &format!("{u} owns a red kayak"), &["project:kayak"]);
        m.importance = 2;
        store::upsert(&pool, m).await.unwrap();
    }
    let mut g = fact(
        "alice",
        "alice guild fact about the kayak club",
        &["org:kayak_club"],
    );
    g.guild_id = Some("g1".into());
    g.importance = 2;
    store::upsert(&pool, g).await.unwrap();
    let mut c9 = fact(
        "alice",
        "character nine secret kayak plan",
        &["project:kayak"],
    );
    c9.character_id = Some(9);
    c9.importance = 2;
    store::upsert(&pool, c9).await.unwrap();
    // A search only reads: the memory lane gives these facts their vectors, as it would.
    for u in ["alice", "bob"] {
        while backfill::fill_vectorless(&svc, u).await.unwrap() > 0 {}
    }

    // bob searches for alice's words: only bob's rows come back.
    for ranker in [
        RankerKind::Hybrid,
        RankerKind::RecencyImportance,
        RankerKind::Weighted,
        RankerKind::Lexical,
        RankerKind::Vector,
    ] {
        let res = search::search(
            &svc,
            &req("bob", "sister Ana Porto bakery beagle kayak locker", ranker),
        )
        .await
        .unwrap();
        assert!(!res.hits.is_empty());
        for h in &res.hits {
            assert!(
                h.text.contains("bob") || h.text.contains("antique maps"),
                "{ranker:?} leaked {h:?}"
            );
        }
    }
    // Character filter: character 7 sees its own and global rows, not character 9's.
    let mut r7 = req("alice", "kayak locker code", RankerKind::Hybrid);
    r7.scope.character_id = Some(7);
    let res = search::search(&svc, &r7).await.unwrap();
    assert!(res.hits.iter().any(|h| h.text.contains("locker code")));
    assert!(res.hits.iter().all(|h| !h.text.contains("character nine")));
    let mut r9 = req("alice", "locker code", RankerKind::Hybrid);
    r9.scope.character_id = Some(9);
    let res = search::search(&svc, &r9).await.unwrap();
    assert!(
        res.hits.iter().all(|h| !h.text.contains("locker")),
        "character 9 sees character 7's message"
    );
    assert!(res.hits.iter().any(|h| h.text.contains("character nine")));
    // No character given: the operator's view of the whole user.
    let res = search::search(&svc, &req("alice", "locker code", RankerKind::Hybrid))
        .await
        .unwrap();
    assert!(res.hits.iter().any(|h| h.text.contains("locker")));
    // Guild is hard: without the guild, the guild's fact is invisible, and vice versa.
    let res = search::search(&svc, &req("alice", "kayak club", RankerKind::Hybrid))
        .await
        .unwrap();
    assert!(res.hits.iter().all(|h| !h.text.contains("guild fact")));
    let mut rg = req("alice", "kayak club", RankerKind::Hybrid);
    rg.scope.guild_id = Some("g1".into());
    let res = search::search(&svc, &rg).await.unwrap();
    assert!(res.hits.iter().any(|h| h.text.contains("guild fact")));
    assert!(res.hits.iter().all(|h| !h.text.contains("red kayak")));
    // Cards and show.
    let cs = cards::cards_for_refs(&pool, &Scope::user("bob"), None)
        .await
        .unwrap();
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0].text, "[project:kayak]: bob owns a red kayak");
    let shown = store::facts(&pool, &Scope::user("bob"), None, 100)
        .await
        .unwrap();
    assert!(shown.iter().all(|f| f.user_id == "bob"));
    // The same caller message id under two users stays two messages.
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_messages WHERE message_id = 'a-1'"
        )
        .await,
        2
    );
}

#[sqlx::test(migrations = false)]
async fn temporal_query_prefers_the_named_month(pool: PgPool) {
    let svc = service(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("t.jsonl");
    let lines = [
        (
            "t1",
            "We went to a concert downtown, it was loud.",
            "2024-03-10T20:00:00Z",
        ),
        (
            "t2",
            "We went to a concert by the river, great band.",
            "2024-05-12T20:00:00Z",
        ),
        (
            "t3",
            "We went to a concert at the stadium.",
            "2024-07-02T20:00:00Z",
        ),
        ("t4", "Just a normal day at work.", "2024-08-01T09:00:00Z"),
    ];
    let body: String = lines
        .iter()
        .map(|(id, text, at)| {
            serde_json::json!({"user_id": "e", "session_id": id, "message_id": id, "speaker": "E", "text": text, "at": at})
                .to_string()
                + "\n"
        })
        .collect();
    std::fs::write(&f, body).unwrap();
    import::import_file(&svc, &f, ExtractMode::None, false, false)
        .await
        .unwrap();
    let res = search::search(
        &svc,
        &req("e", "which concert did we see in May?", RankerKind::Hybrid),
    )
    .await
    .unwrap();
    let w = res.time_window.as_ref().expect("a window");
    assert_eq!(w.start, at("2024-05-01T00:00:00Z"));
    assert_eq!(res.hits[0].id, "t2");
    // As of April, nothing after April exists yet.
    let mut early = req("e", "concert", RankerKind::Hybrid);
    early.as_of = Some(at("2024-04-01T00:00:00Z"));
    let res = search::search(&svc, &early).await.unwrap();
    assert_eq!(
        res.hits.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(),
        vec!["t1"]
    );
}

#[sqlx::test(migrations = false)]
async fn cli_search_prints_the_documented_json(pool: PgPool) {
    common::migrate(&pool).await;
    let opts = pool.connect_options();
    let url = format!(
        "postgres://{}@{}:{}/{}",
        opts.get_username(),
        opts.get_host(),
        opts.get_port(),
        opts.get_database().unwrap_or("postgres")
    );
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/memory_chats.jsonl"
    );
    let out = common::kvmem_command(&url)
        .env("KVMEM_MEMORY_EMBED_MODEL_PATH", default_embedder())
        .args(["memory", "import", "--file", fixture, "--json"])
        .output()
        .unwrap();
    common::assert_success(&out);
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["imported"], 5);
    let out = common::kvmem_command(&url)
        .env("KVMEM_MEMORY_EMBED_MODEL_PATH", default_embedder())
        .args([
            "memory",
            "search",
            "--user",
            "alice",
            "--query",
            "where did my sister move",
            "--limit",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    common::assert_success(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["query"], "where did my sister move");
    assert_eq!(v["ranker"], "hybrid");
    let hits = v["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 2);
    let h = &hits[0];
    assert_eq!(h["kind"], "message");
    assert_eq!(h["id"], "a-1");
    assert_eq!(h["source_message_ids"], serde_json::json!(["a-1"]));
    assert_eq!(h["session_id"], "a1");
    assert_eq!(h["at"], "2024-05-03T10:00:00Z");
    assert!(h["score"].as_f64().unwrap() > 0.0);
    assert!(h["components"]["semantic"].as_f64().unwrap() > 0.0);
    assert!(h["text"].as_str().unwrap().contains("Porto"));
    let bad = common::kvmem_command(&url)
        .args([
            "memory", "search", "--user", "alice", "--query", "x", "--limit", "0", "--json",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--limit"));
    let _ = HitKind::Memory;
}
