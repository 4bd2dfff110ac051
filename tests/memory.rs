//! Long-term memory on real Postgres and the real MiniLM embedder: keys, history,
//! concurrency, archiving, rankers against hand-computed numbers, cards, remember/forget,
//! degradation, tenant walls, import and the CLI's JSON.

mod common;

use common::minilm;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Duration, Utc};
use kvmem::memory::embed::Role;
use kvmem::memory::ingest::import::{self, ExtractMode};
use kvmem::memory::ingest::jobs::{self, Outcome};
use kvmem::memory::search::rank::{self, Signals};
use kvmem::memory::search::{self, cards, HitKind, SearchRequest};
use kvmem::memory::store::{self, FactType, Kind, NewMemory, Scope, Source, Upserted};
use kvmem::memory::{Embedder, MemoryConfig, MemoryService, RankerKind};
use sqlx::PgPool;

/// One embedder for the whole test binary: loading it per test would only cost time.
fn embedder() -> Arc<Embedder> {
    static E: OnceLock<Arc<Embedder>> = OnceLock::new();
    E.get_or_init(|| Arc::new(Embedder::load(&minilm(), 1).expect("load MiniLM")))
        .clone()
}

fn config(path: Option<PathBuf>) -> MemoryConfig {
    MemoryConfig {
        embed_model_path: path,
        ranker: RankerKind::Hybrid,
        keep_user: 80,
        keep_lore: 120,
        exact_search_max: 20_000,
        n_threads: 1,
    }
}

async fn service(pool: &PgPool) -> MemoryService {
    common::migrate(pool).await;
    MemoryService {
        pool: pool.clone(),
        config: config(Some(minilm())),
        embedder: Some(embedder()),
        extractor: None,
    }
}

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn fact(user: &str, text: &str, refs: &[&str]) -> NewMemory {
    let mut m = NewMemory::new(
        user,
        Kind::People,
        FactType::Relationship,
        text,
        Source::Extraction,
    );
    m.entity_refs = refs.iter().map(|r| r.to_string()).collect();
    m
}

async fn import_fixture(svc: &MemoryService) -> import::ImportReport {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/memory_chats.jsonl"
    );
    import::import_file(
        svc,
        std::path::Path::new(path),
        ExtractMode::None,
        false,
        false,
    )
    .await
    .expect("import")
}

/// Imports `n` messages of user carol (ten to a session, July 2024) through a file, as the
/// CLI does; `line(i)` gives each one's speaker and text.
async fn import_carol(
    svc: &MemoryService,
    n: usize,
    line: impl Fn(usize) -> (&'static str, String),
) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("carol.jsonl");
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let (speaker, text) = line(i);
            serde_json::json!({"user_id": "carol", "session_id": format!("c{}", i / 10),
                "message_id": format!("c-{i}"), "speaker": speaker, "text": text,
                "at": format!("2024-07-{:02}T10:00:00Z", 1 + i % 28)})
            .to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    import::import_file(svc, &file, ExtractMode::None, true, false)
        .await
        .unwrap();
}

fn req(user: &str, query: &str, ranker: RankerKind) -> SearchRequest {
    SearchRequest {
        scope: Scope::user(user),
        query: query.into(),
        limit: 10,
        as_of: None,
        ranker,
        strict: false,
        skip_speaker: None,
    }
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

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

/// A search's query goes through the embedder's one-thread context, stored messages through
/// the batch context on every thread: the query must land where the same text stored does.
#[test]
fn a_query_embeds_as_the_same_text_does_in_a_batch() {
    let e = Embedder::load(&minilm(), 2).expect("load MiniLM");
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
    assert_eq!((h.components["semantic"], h.components["span"]), (0.8, 0.6));
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
    let svc = MemoryService::new(
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
    let svc = MemoryService::new(
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

#[sqlx::test(migrations = false)]
async fn import_is_idempotent_and_reports_bad_lines(pool: PgPool) {
    let svc = service(&pool).await;
    let first = import_fixture(&svc).await;
    assert_eq!(
        (
            first.imported,
            first.skipped_duplicate,
            first.rejected,
            first.embedded
        ),
        (5, 0, 0, 5)
    );
    let second = import_fixture(&svc).await;
    assert_eq!((second.imported, second.skipped_duplicate), (0, 5));
    assert_eq!(
        count(&pool, "SELECT count(*) FROM memory_messages").await,
        5
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"user_id\":\"c\",\"session_id\":\"s\",\"message_id\":\"1\",\"speaker\":\"C\",\"text\":\"hello there\",\"at\":\"2024-01-01T00:00:00Z\"}\n\
         {\"user_id\":\"c\",\"session_id\":\"s\",\"message_id\":\"2\",\"speaker\":\"C\",\"text\":\"hi\",\"at\":\"tuesday\"}\n\
         not json\n",
    )
    .unwrap();
    let strict = import::import_file(&svc, &bad, ExtractMode::None, true, false).await;
    assert!(strict.unwrap_err().to_string().contains("line 2"));
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_messages WHERE user_id = 'c'"
        )
        .await,
        0
    );
    let lax = import::import_file(&svc, &bad, ExtractMode::None, false, false)
        .await
        .unwrap();
    assert_eq!((lax.imported, lax.rejected), (1, 2));
    assert!(
        lax.rejections[0].starts_with("line 2: at"),
        "{:?}",
        lax.rejections
    );
    assert!(lax.rejections[1].starts_with("line 3: not a valid record"));
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
async fn live_turn_messages_feed_the_corpus_and_the_lane(pool: PgPool) {
    let svc = service(&pool).await;
    let ch = common::character(&pool, "carol", "Vega").await;
    let turn: i64 = sqlx::query_scalar(
        "INSERT INTO turns (session_id, user_id, character_id, message, state) VALUES ('s1', 'carol', $1, 'x', 'done') RETURNING id",
    )
    .bind(ch)
    .fetch_one(&pool)
    .await
    .unwrap();
    for (role, text) in [
        ("user", "I finally booked my trip to Kyoto"),
        ("assistant", "Wonderful, enjoy the temples!"),
    ] {
        sqlx::query(
            "INSERT INTO messages (session_id, turn_id, role, content) VALUES ('s1', $1, $2, $3)",
        )
        .bind(turn)
        .bind(role)
        .bind(text)
        .execute(&pool)
        .await
        .unwrap();
    }
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_messages WHERE user_id = 'carol'"
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_jobs WHERE kind = 'ingest' AND state = 'queued'"
        )
        .await,
        2
    );
    let out = jobs::drain(&svc).await.unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_messages WHERE embedding IS NOT NULL"
        )
        .await,
        2
    );
    let res = search::search(&svc, &req("carol", "vacation in Japan", RankerKind::Hybrid))
        .await
        .unwrap();
    assert_eq!(res.hits[0].id, format!("turn:{turn}:user"));
    assert!(matches!(
        jobs::process_next_memory_job(&svc).await.unwrap(),
        Outcome::Empty
    ));
}

/// A migrated database whose memory backlog holds at most `cap` queued ingest jobs a user.
async fn migrate_with_backlog_cap(pool: &PgPool, cap: i32) {
    common::migrate(pool).await;
    sqlx::query("UPDATE kvmem_config SET value = $1::text WHERE key = 'memory_backlog_max'")
        .bind(cap)
        .execute(pool)
        .await
        .unwrap();
}

/// A completion batch inserts many users' messages in one statement; the backlog rule
/// still holds per user, and one user's overflow drops none of another's jobs.
#[sqlx::test(migrations = false)]
async fn one_statement_of_many_messages_keeps_the_backlog_rule_per_user(pool: PgPool) {
    migrate_with_backlog_cap(&pool, 3).await;
    let mut turns = Vec::new();
    for (user, n) in [("dora", 3), ("eli", 1)] {
        let ch = common::character(&pool, user, "Vega").await;
        for i in 0..n {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO turns (session_id, user_id, character_id, message, state)
                 VALUES ($1, $2, $3, 'x', 'done') RETURNING id",
            )
            .bind(format!("{user}-s"))
            .bind(user)
            .bind(ch)
            .fetch_one(&pool)
            .await
            .unwrap();
            turns.push((id, format!("{user}-s"), i));
        }
    }
    // Interleaved as a batch of turns from two users is: dora, dora, eli, dora.
    let order = [0usize, 1, 3, 2];
    let mut values = Vec::new();
    for &k in &order {
        let (id, sid, i) = &turns[k];
        values.push(format!("('{sid}', {id}, 'user', 'message {i}')"));
        values.push(format!("('{sid}', {id}, 'assistant', 'reply {i}')"));
    }
    sqlx::query(&format!(
        "INSERT INTO messages (session_id, turn_id, role, content) VALUES {}",
        values.join(", ")
    ))
    .execute(&pool)
    .await
    .unwrap();

    let dora: Vec<(String, String)> = sqlx::query_as(
        "SELECT m.message_id, j.state FROM memory_jobs j
           JOIN memory_messages m ON m.id = j.memory_message_id
          WHERE j.user_id = 'dora' ORDER BY j.id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let states: Vec<&str> = dora.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        states,
        ["dropped", "dropped", "dropped", "queued", "queued", "queued"],
        "dora's six messages leave the newest three: {dora:?}"
    );
    let expected_first = format!("turn:{}:user", turns[0].0);
    assert_eq!(dora[0].0, expected_first, "jobs follow message order");
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_jobs WHERE user_id = 'eli' AND state = 'queued'"
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &pool,
            "SELECT coalesce(sum(dropped), 0)::bigint FROM memory_job_drops WHERE user_id = 'dora'"
        )
        .await,
        3
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_job_drops WHERE user_id = 'eli'"
        )
        .await,
        0
    );
}

#[sqlx::test(migrations = false)]
async fn backlog_overflow_drops_oldest_and_counts(pool: PgPool) {
    migrate_with_backlog_cap(&pool, 3).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO memory_messages (user_id, session_id, message_id, speaker, text, at)
             VALUES ('d', 's', $1, 'D', 'some message text', now()) RETURNING id",
        )
        .bind(format!("m{i}"))
        .fetch_one(&pool)
        .await
        .unwrap();
        sqlx::query("SELECT kvmem_memory_queue_ingest($1)")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        // Same-message dedup: queueing twice adds nothing.
        sqlx::query("SELECT kvmem_memory_queue_ingest($1)")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        ids.push(id);
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM memory_jobs").await, 5);
    let dropped: Vec<i64> = sqlx::query_scalar(
        "SELECT memory_message_id FROM memory_jobs WHERE state = 'dropped' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(dropped, ids[..2].to_vec());
    assert_eq!(
        count(
            &pool,
            "SELECT dropped FROM memory_job_drops WHERE user_id = 'd'"
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
        .env("KVMEM_MEMORY_EMBED_MODEL_PATH", minilm())
        .args(["memory", "import", "--file", fixture, "--json"])
        .output()
        .unwrap();
    common::assert_success(&out);
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["imported"], 5);
    let out = common::kvmem_command(&url)
        .env("KVMEM_MEMORY_EMBED_MODEL_PATH", minilm())
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

/// `import --extract llm` then `memory work`: a process without an extraction model leaves
/// the jobs queued and says so; one with the model runs the extractor on every message.
#[sqlx::test(migrations = false)]
async fn memory_work_never_marks_an_extraction_done_without_running_it(pool: PgPool) {
    common::migrate(&pool).await;
    let url = common::db_url(&pool).await;
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/memory_chats.jsonl"
    );
    let out = common::kvmem_command(&url)
        .env("KVMEM_MEMORY_EMBED_MODEL_PATH", minilm())
        .args([
            "memory",
            "import",
            "--file",
            fixture,
            "--extract",
            "llm",
            "--json",
        ])
        .output()
        .unwrap();
    common::assert_success(&out);
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["queued_for_extraction"], 5);
    let jobs = |state: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM memory_jobs WHERE state = $1")
                .bind(state)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let out = common::kvmem_command(&url)
        .env("KVMEM_MEMORY_EMBED_MODEL_PATH", minilm())
        .env("KVMEM_MEMORY_EXTRACT", "false")
        .args(["memory", "work"])
        .output()
        .unwrap();
    common::assert_success(&out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ran 0 memory job(s)"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("5 job(s) ask for fact extraction"), "{err}");
    assert_eq!(jobs("queued").await, 5);
    assert_eq!(jobs("done").await, 0);

    let out = common::kvmem_command(&url)
        .env("KVMEM_MEMORY_EMBED_MODEL_PATH", minilm())
        .env("KVMEM_MEMORY_EXTRACT", "true")
        .env("KVMEM_MEMORY_EXTRACT_MODEL_PATH", common::tiny_model())
        .args(["memory", "work"])
        .output()
        .unwrap();
    common::assert_success(&out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ran 5 memory job(s)"
    );
    assert_eq!(jobs("queued").await, 0);
    // Every job ran the extractor (no speaker in the fixture is the character's "assistant").
    let results: Vec<(String, serde_json::Value)> = sqlx::query_as(
        "SELECT m.speaker, j.result FROM memory_jobs j \
           JOIN memory_messages m ON m.id = j.memory_message_id WHERE j.state = 'done'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(results.len(), 5);
    for (speaker, r) in &results {
        let ran = r["extracted"] == true || r.get("extract_error").is_some();
        assert_eq!(ran, speaker != "assistant", "{speaker}: {r}");
    }
}

#[sqlx::test(migrations = false)]
async fn an_orphaned_running_job_is_run_again(pool: PgPool) {
    let svc = service(&pool).await;
    let job: i64 = sqlx::query_scalar("SELECT kvmem_remember('f', NULL, 'likes green tea')")
        .fetch_one(&pool)
        .await
        .unwrap();
    // A worker claimed it and died: running, started long ago.
    sqlx::query("UPDATE memory_jobs SET state = 'running', started_at = now() - interval '10 minutes' WHERE id = $1")
        .bind(job)
        .execute(&pool)
        .await
        .unwrap();
    let out = jobs::drain(&svc).await.unwrap();
    assert!(
        matches!(&out[..], [Outcome::Done { job_id, .. }] if *job_id == job),
        "{out:?}"
    );
    // A fresh running job of another worker is left alone.
    let other: i64 = sqlx::query_scalar("SELECT kvmem_remember('f', NULL, 'likes black coffee')")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE memory_jobs SET state = 'running', started_at = now() WHERE id = $1")
        .bind(other)
        .execute(&pool)
        .await
        .unwrap();
    assert!(matches!(
        jobs::process_next_memory_job(&svc).await.unwrap(),
        Outcome::Empty
    ));
}

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
    sqlx::query(include_str!("../sql/memory/hnsw_settings.sql"))
        .bind("200")
        .execute(&mut *tx)
        .await
        .unwrap();
    let q = pgvector::Vector::from(vec![0.05_f32; 384]);
    let plan: serde_json::Value = sqlx::query_scalar(&format!(
        "EXPLAIN (FORMAT JSON) {}",
        include_str!("../sql/memory/search_messages_vectors.sql")
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
    let path = dir.path().join("minilm.gguf");
    std::os::unix::fs::symlink(minilm(), &path).unwrap();
    let a = MemoryService::new(pool.clone(), config(Some(path.clone()))).await;
    let b = MemoryService::new(pool.clone(), config(Some(path.clone()))).await;
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

/// Writes `lines` (speaker, text) as one session of `user` to a file and imports it.
async fn import_session(
    svc: &MemoryService,
    user: &str,
    lines: &[(&str, &str)],
) -> import::ImportReport {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("session.jsonl");
    let rows: Vec<String> = lines
        .iter()
        .enumerate()
        .map(|(i, (speaker, text))| {
            serde_json::json!({"user_id": user, "session_id": format!("{user}-s1"),
                "message_id": format!("{user}-{i}"), "speaker": speaker, "text": text,
                "at": format!("2024-03-02T10:{i:02}:00Z")})
            .to_string()
        })
        .collect();
    std::fs::write(&file, rows.join("\n")).unwrap();
    import::import_file(svc, &file, ExtractMode::None, true, false)
        .await
        .unwrap()
}

const POTTERY: &[(&str, &str)] = &[
    ("Pri", "Morning! Did the plumber ever show up?"),
    ("Dana", "He did, the sink is fixed. Finally."),
    ("Pri", "How was the pottery class at Clayhouse on Saturday?"),
    ("Dana", "Honestly amazing. Three bowls and a wonky mug."),
    ("Pri", "Send pictures!!"),
    ("Dana", "Later, I'm off to the gym."),
    ("Pri", "My train is late again, the usual."),
];

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
    assert!(answer.components["span"] > 0.0, "{answer:?}");
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
    let bread = "The sourdough starter needs feeding twice a day with rye flour and warm water, \
                 then the dough rests overnight in the fridge, gets folded four times, shaped \
                 into a round loaf, scored with a razor and baked in a cast iron pot at high heat \
                 for forty minutes with the lid on and twenty more with it off. Then it cools \
                 on a rack for an hour before anyone is allowed to cut it.";
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
    let same = dot(&with_it, &before_it);
    assert!(same < 0.99, "the two spans embed alike: cosine {same}");
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
    assert_eq!(res.hits[0].id, "dana-0", "{:?}", res.hits);
    for h in &res.hits {
        let voiced = h.components.contains_key("voice");
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
        both.hits
            .iter()
            .all(|h| !h.components.contains_key("voice")),
        "{:?}",
        both.hits
    );
}
