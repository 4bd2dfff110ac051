//! Every stored vector names the model that made it, and a search compares its query only
//! with vectors of its own model: a switch of embedder on a live database leaves the old
//! vectors out of the vector legs (and says how many), `kvmem memory reindex` embeds them
//! again and resumes after a kill, and none of it crosses the wall between users. Real
//! Postgres, with both real embedders (all-MiniLM-L6-v2 and multilingual-e5-small).

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::memory::req;
use crate::sessions::{import_session, POTTERY};
use common::{db_url, e5, kvmem_command, minilm};
use kvmem::memory::ingest::import;
use kvmem::memory::search::{self, HitKind, SearchResponse};
use kvmem::memory::store::{self, FactType, Kind, NewMemory, Source};
use kvmem::memory::{Embedder, MemoryConfig, MemoryService, RankerKind};
use sqlx::PgPool;

/// A hybrid service over the process's one copy of the model at `path` (shared with the
/// binary's other tests); a model that does not load fails the test here, not later.
fn service(pool: &PgPool, path: std::path::PathBuf) -> MemoryService {
    let embedder = Embedder::shared(&path, 1).expect("load the embedder");
    let config = MemoryConfig {
        embed_model_path: Some(path),
        ranker: RankerKind::Hybrid,
        keep_user: 80,
        keep_lore: 120,
        exact_search_max: 20_000,
        n_threads: 1,
        embed_gpu: kvmem::engine::GpuChoice::CPU,
    };
    kvmem::system::memory_service_on(pool.clone(), config, Some(embedder))
}

async fn minilm_service(pool: &PgPool) -> MemoryService {
    common::migrate(pool).await;
    service(pool, minilm())
}

fn e5_service(pool: &PgPool) -> MemoryService {
    service(pool, e5())
}

async fn remember(svc: &MemoryService, user: &str, text: &str) {
    let mut m = NewMemory::new(user, Kind::Profile, FactType::Other, text, Source::Explicit);
    svc.embed_memory(&mut m).await;
    store::upsert(&svc.pool, m).await.unwrap();
}

/// The vector legs' parts of every hit: 0 when no vector of the query's model took part.
fn dense(res: &SearchResponse) -> f64 {
    res.hits
        .iter()
        .map(|h| {
            let c = &h.components;
            [c.semantic, c.span, c.voice]
                .iter()
                .map(|v| v.unwrap_or(0.0).abs())
                .sum::<f64>()
        })
        .sum()
}

async fn models(pool: &PgPool, sql: &str) -> Vec<Option<String>> {
    sqlx::query_scalar(sql).fetch_all(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_search_compares_its_query_only_with_vectors_of_its_own_model(pool: PgPool) {
    let old = minilm_service(&pool).await;
    let new = e5_service(&pool);
    let (old_id, new_id) = (old.model_id().unwrap(), new.model_id().unwrap());
    assert_ne!(old_id, new_id, "two models, two ids");
    import_session(&old, "dana", POTTERY).await;
    remember(&old, "dana", "Dana goes to a ceramics studio on weekends").await;
    let of = |sql| models(&pool, sql);
    assert_eq!(
        of("SELECT DISTINCT embed_model FROM memory_messages").await,
        vec![Some(old_id.to_string())]
    );
    assert_eq!(
        of("SELECT DISTINCT span_embed_model FROM memory_messages").await,
        vec![Some(old_id.to_string())]
    );

    // The switch: every message and the fact are another model's. Words still find them;
    // no vector takes part, and the response says how many messages were left out.
    let paraphrase = "how did the ceramics workshop go";
    for ranker in [RankerKind::Hybrid, RankerKind::Weighted, RankerKind::Vector] {
        let res = search::search(&new, &req("dana", paraphrase, ranker))
            .await
            .unwrap();
        assert_eq!(res.without_vector, POTTERY.len() as i64, "{ranker:?}");
        assert_eq!(res.vector_model.as_deref(), Some(new_id));
        assert_eq!(
            dense(&res),
            0.0,
            "{ranker:?} compared another model's vectors: {res:?}"
        );
    }
    let res = search::search(&new, &req("dana", "plumber", RankerKind::Hybrid))
        .await
        .unwrap();
    assert_eq!(
        res.hits[0].id, "dana-0",
        "the lexical legs still search old rows"
    );

    let n = import::reindex(&new, Some("dana"), false).await.unwrap();
    assert_eq!(n, 2 * POTTERY.len() + 1, "keys, spans and the fact");
    assert_eq!(
        of("SELECT DISTINCT embed_model FROM memory_messages").await,
        vec![Some(new_id.to_string())]
    );
    assert_eq!(
        of("SELECT DISTINCT span_embed_model FROM memory_messages").await,
        vec![Some(new_id.to_string())]
    );
    assert_eq!(
        of("SELECT DISTINCT embed_model FROM memories").await,
        vec![Some(new_id.to_string())]
    );
    let res = search::search(&new, &req("dana", paraphrase, RankerKind::Hybrid))
        .await
        .unwrap();
    assert_eq!(res.without_vector, 0);
    assert!(dense(&res) > 0.0, "the new vectors take part: {res:?}");
    let top: Vec<&str> = res.hits.iter().take(3).map(|h| h.id.as_str()).collect();
    assert!(
        top.iter()
            .any(|id| ["dana-2", "dana-3"].contains(id) || id.starts_with("memory:")),
        "the pottery exchange or the fact answers the paraphrase: {top:?}"
    );
    // And the other way round: the old model now finds no vector of its own.
    let res = search::search(&old, &req("dana", paraphrase, RankerKind::Hybrid))
        .await
        .unwrap();
    assert_eq!(res.without_vector, POTTERY.len() as i64);
    assert_eq!(dense(&res), 0.0);
    // A second reindex has nothing left to do.
    assert_eq!(import::reindex(&new, Some("dana"), false).await.unwrap(), 0);
}

#[sqlx::test(migrations = false)]
async fn reindex_killed_midway_resumes_and_loses_nothing(pool: PgPool) {
    let old = minilm_service(&pool).await;
    let lines: Vec<(String, String)> = (0..260)
        .map(|i| {
            let who = if i % 2 == 0 { "Pri" } else { "Dana" };
            (
                who.to_string(),
                format!("Message {i}: the weather on day {i} was fine."),
            )
        })
        .collect();
    let borrowed: Vec<(&str, &str)> = lines
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    import_session(&old, "dana", &borrowed).await;
    let new_id = e5_service(&pool).model_id().unwrap().to_string();
    let of_new = |pool: PgPool, id: String| async move {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM memory_messages WHERE embed_model = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        n
    };

    let url = db_url(&pool).await;
    let reindex = || {
        let mut cmd = kvmem_command(&url);
        cmd.args(["memory", "reindex", "--user", "dana"])
            .env("KVMEM_MEMORY_EMBED_MODEL_PATH", e5())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        cmd
    };
    let mut child = reindex().spawn().expect("start kvmem memory reindex");
    // Killed once its first chunk of message vectors has committed, before the rest.
    let deadline = Instant::now() + Duration::from_secs(120);
    let first = loop {
        let n = of_new(pool.clone(), new_id.clone()).await;
        if n > 0 {
            break n;
        }
        assert!(Instant::now() < deadline, "no chunk committed");
        assert!(
            child.try_wait().unwrap().is_none(),
            "reindex ended before the kill"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        first < 260,
        "the kill came before the last chunk ({first} of 260)"
    );
    let after_kill = of_new(pool.clone(), new_id.clone()).await;
    assert!(
        after_kill < 260,
        "the kill came mid-run ({after_kill} of 260)"
    );

    let out = reindex().output().expect("run kvmem memory reindex again");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    let redone: usize = said
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no count in {said:?}"));
    // The second run embeds what the first left: the messages it had not reached and every
    // span (spans follow the messages), not the chunks that had committed.
    assert!(
        redone <= 520 - after_kill as usize,
        "the second run redid committed work: {redone} vectors after {after_kill} were kept"
    );
    assert_eq!(of_new(pool.clone(), new_id.clone()).await, 260);
    let spans: i64 =
        sqlx::query_scalar("SELECT count(*) FROM memory_messages WHERE span_embed_model = $1")
            .bind(&new_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(spans, 260);
    let messages: i64 = sqlx::query_scalar("SELECT count(*) FROM memory_messages")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(messages, 260, "nothing lost or doubled");
}

/// Alice is still on the old model; Bob's history was reindexed with the new one. Every leg
/// is given something of Bob's to find for Alice's question (the same words, a close
/// meaning, the same named speaker, the same day, a fact), and none of it reaches her.
#[sqlx::test(migrations = false)]
async fn a_switch_never_crosses_the_wall_between_users(pool: PgPool) {
    let old = minilm_service(&pool).await;
    let new = e5_service(&pool);
    let alice: &[(&str, &str)] = &[
        ("Pri", "Did you book the cabin by the lake?"),
        ("Dana", "Yes, for the first weekend of March."),
    ];
    let bob: &[(&str, &str)] = &[
        ("Pri", "Did you book the cabin by the lake for March?"),
        (
            "Dana",
            "Booked the lakeside cabin, first weekend of March, the one with the sauna.",
        ),
        ("Dana", "I booked the lake cabin on the 2nd of March."),
    ];
    import_session(&old, "alice", alice).await;
    import_session(&old, "bob", bob).await;
    remember(&old, "bob", "Dana booked the lake cabin for March").await;
    import::reindex(&new, Some("bob"), false).await.unwrap();
    let alice_models = models(
        &pool,
        "SELECT DISTINCT embed_model FROM memory_messages WHERE user_id = 'alice'",
    )
    .await;
    assert_eq!(
        alice_models,
        vec![old.model_id().map(str::to_string)],
        "Bob's reindex touched Alice"
    );

    let questions = [
        "Did Dana book the lake cabin?",
        "what did Dana say about the sauna",
        "what happened on the 2nd of March",
        "lakeside holiday plans",
    ];
    for svc in [&old, &new] {
        for q in questions {
            for ranker in [
                RankerKind::Hybrid,
                RankerKind::RecencyImportance,
                RankerKind::Weighted,
                RankerKind::Lexical,
                RankerKind::Vector,
            ] {
                let res = search::search(svc, &req("alice", q, ranker)).await.unwrap();
                for h in &res.hits {
                    assert!(
                        h.kind == HitKind::Message && h.id.starts_with("alice-"),
                        "{q:?} {ranker:?} gave Alice {h:?}"
                    );
                }
                let own = if Some(svc.model_id().unwrap()) == old.model_id() {
                    0
                } else {
                    alice.len()
                };
                assert_eq!(
                    res.without_vector, own as i64,
                    "Alice's count is hers alone"
                );
            }
        }
    }
    // Bob, on the new model, finds his own through the vector legs.
    let res = search::search(
        &new,
        &req("bob", "lakeside holiday plans", RankerKind::Hybrid),
    )
    .await
    .unwrap();
    assert_eq!(res.without_vector, 0);
    assert!(dense(&res) > 0.0);
    assert!(res
        .hits
        .iter()
        .all(|h| h.id.starts_with("bob-") || h.id.starts_with("memory:")));
}
