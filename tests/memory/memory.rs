//! Long-term memory on real Postgres and the real default embedder (e5-small): keys, history,
//! concurrency, archiving, rankers against hand-computed numbers, cards, remember/forget,
//! degradation, tenant walls, import and the CLI's JSON.

use crate::common;

use common::default_embedder;

use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use kvmem::memory::embed::Role;
use kvmem::memory::ingest::backfill;
use kvmem::memory::ingest::import::{self, ExtractMode};
use kvmem::memory::ingest::jobs::{self, Outcome};
use kvmem::memory::search::rank::{self, Signals};
use kvmem::memory::search::{self, cards, HitKind, SearchRequest};
use kvmem::memory::store::{self, FactType, Kind, NewMemory, Scope, Source, Upserted};
use kvmem::memory::{Embedder, MemoryConfig, MemoryService, RankerKind};
use sqlx::PgPool;

/// The process's one embedder: loading it per test would only cost time.
fn embedder() -> Arc<Embedder> {
    Embedder::shared(&default_embedder(), 1).expect("load the embedder")
}

fn config(path: Option<PathBuf>) -> MemoryConfig {
    MemoryConfig {
        embed_model_path: path,
        ranker: RankerKind::Hybrid,
        keep_user: 80,
        keep_lore: 120,
        exact_search_max: 20_000,
        n_threads: 1,
        embed_gpu: kvmem::engine::GpuChoice::CPU,
    }
}

async fn service(pool: &PgPool) -> MemoryService {
    common::migrate(pool).await;
    kvmem::system::memory_service_on(
        pool.clone(),
        config(Some(default_embedder())),
        Some(embedder()),
    )
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

/// A search of `user`'s memory as the tests ask it: ten hits, now, no filters.
pub(crate) fn req(user: &str, query: &str, ranker: RankerKind) -> SearchRequest {
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

mod facts;
mod ingest;
mod ranking;
mod reads;
mod vectors;
