//! Long-term memory exists because a character forgets everything that has left the KV
//! tail: typed facts with history, the searchable dialogue and their retrieval live in
//! Postgres next to the queue, so a backend can read them with SQL and a worker can write
//! them on the memory lane without ever blocking a turn.
//!
//! Rooms: [`store`] (facts, keys, history, archiving, entity refs and aliases, the
//! screens every stored fact passes), [`search`] (retrieval: the candidate legs, fusion
//! and ranking, time parsing, entity cards), [`ingest`] (extraction with its grammar, its
//! model thread, bulk import), `ingest::jobs` (the memory lane), [`notes`] (the character's own:
//! remember this about X, memory lines, the explicit-facts blob), `notes::todos` (seed 001's
//! persona-scoped open loops), [`embed`] (MiniLM on llama.cpp, shared by store, search and
//! ingest) and [`render`] (journal and MEMORY.md, for both faces). The faces themselves
//! are `cmd::memory` and `http::memory_api`.

pub mod embed;
pub mod ingest;
pub mod notes;
pub mod render;
pub mod search;
pub mod store;

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::config::Settings;
pub use embed::Embedder;

/// Errors of the memory layer. Embedder failures are not here on purpose: they degrade
/// to lexical retrieval and are recorded as events instead of failing the caller.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("embedder: {0}")]
    Embed(#[from] embed::EmbedError),
    #[error("extractor: {0}")]
    Extract(String),
}

pub type Result<T, E = MemoryError> = std::result::Result<T, E>;

/// The named rankers: two fixed weighted formulas and kvmem's fused default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RankerKind {
    /// 0.40 similarity, 0.30 recency (14-day half-life), 0.30 entity frequency.
    #[serde(rename = "recency-importance", alias = "seed001")]
    RecencyImportance,
    /// 0.50 semantic, 0.28 lexical, 0.10 confidence, 0.07 recency, 0.05 channel, with a
    /// relevance gate.
    #[serde(rename = "weighted", alias = "seed002")]
    Weighted,
    /// Reciprocal-rank fusion of lexical, vector and time-window lists.
    #[default]
    Hybrid,
    /// Postgres full-text rank only (for the benchmark's side-by-side).
    Lexical,
    /// MiniLM cosine only (for the benchmark's side-by-side).
    Vector,
}

impl RankerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RankerKind::RecencyImportance => "recency-importance",
            RankerKind::Weighted => "weighted",
            RankerKind::Hybrid => "hybrid",
            RankerKind::Lexical => "lexical",
            RankerKind::Vector => "vector",
        }
    }

    /// Parses a ranker's name. The spellings of the previous release (`seed001`,
    /// `seed002`, named after the documents they came from) still parse, with a warning.
    pub fn parse(s: &str) -> Result<RankerKind> {
        let name = s.trim().to_ascii_lowercase();
        let renamed = match name.as_str() {
            "seed001" => Some(RankerKind::RecencyImportance),
            "seed002" => Some(RankerKind::Weighted),
            _ => None,
        };
        if let Some(kind) = renamed {
            tracing::warn!(
                "ranker {name:?} is deprecated and will be removed in the next release: use {:?}",
                kind.as_str()
            );
            return Ok(kind);
        }
        match name.as_str() {
            "recency-importance" => Ok(RankerKind::RecencyImportance),
            "weighted" => Ok(RankerKind::Weighted),
            "hybrid" => Ok(RankerKind::Hybrid),
            "lexical" => Ok(RankerKind::Lexical),
            "vector" => Ok(RankerKind::Vector),
            other => Err(MemoryError::Invalid(format!(
                "unknown ranker {other:?} (hybrid, weighted, recency-importance, lexical, vector)"
            ))),
        }
    }
}

/// A fact proposed by an extractor for one message (at most 4 are kept per message).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExtractedFact {
    pub text: String,
    pub fact_type: store::FactType,
    pub kind: store::Kind,
    /// `<type>:<name>`; the name is slugged on write.
    #[serde(default)]
    pub entity_refs: Vec<String>,
    #[serde(default)]
    pub entity_label: Option<String>,
    #[serde(default)]
    pub importance: Option<i16>,
    #[serde(default)]
    pub confidence: Option<f32>,
    #[serde(default)]
    pub evidence_text: Option<String>,
}

/// The seam the extraction branch plugs into: grammar-constrained LLM extraction and
/// seed 002's filters live behind it. Blocking: it runs on a blocking thread.
pub trait Extractor: Send + Sync {
    fn extract(
        &self,
        speaker: &str,
        text: &str,
    ) -> std::result::Result<Vec<ExtractedFact>, ExtractError>;

    /// Seed 004's "remember this about X": one third-person fact about `name` from what
    /// the user said (`said`). The caller checks it against `said` before storing it.
    fn summarize_about(&self, name: &str, said: &str) -> std::result::Result<String, ExtractError> {
        let _ = (name, said);
        Err(ExtractError("this extractor does not summarise".into()))
    }
}

/// Why an [`Extractor`] gave no answer: its model failed, or its thread stopped. The text
/// is what the job's result and the `memory_extract_error` event record.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ExtractError(pub String);

/// Memory settings, from [`Settings`].
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    pub embed_model_path: Option<PathBuf>,
    pub ranker: RankerKind,
    pub keep_user: i64,
    pub keep_lore: i64,
    pub exact_search_max: i64,
    pub n_threads: i32,
}

impl MemoryConfig {
    pub fn from_settings(s: &Settings) -> Result<MemoryConfig> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as i32);
        Ok(MemoryConfig {
            embed_model_path: s.memory_embed_model_path.clone(),
            ranker: RankerKind::parse(&s.memory_ranker)?,
            keep_user: i64::from(s.memory_keep_user),
            keep_lore: i64::from(s.memory_keep_lore),
            exact_search_max: i64::from(s.memory_exact_search_max),
            n_threads: if s.n_threads == 0 {
                cores
            } else {
                s.n_threads as i32
            },
        })
    }
}

/// What the memory layer needs at run time: the pool, the embedder when it loaded, and an
/// extractor when one is configured.
#[derive(Clone)]
pub struct MemoryService {
    pub pool: PgPool,
    pub config: MemoryConfig,
    pub embedder: Option<Arc<Embedder>>,
    pub extractor: Option<Arc<dyn Extractor>>,
}

impl MemoryService {
    /// Takes the process's embedder (loaded on first use, then shared by every service) if
    /// it can. A missing or broken model file is not an error (seed
    /// 004's graceful degradation): a loud warning on stderr, an event row, and retrieval
    /// falls back to lexical scoring.
    pub async fn new(pool: PgPool, config: MemoryConfig) -> MemoryService {
        let embedder = match &config.embed_model_path {
            None => {
                degrade(&pool, "no memory_embed_model_path configured").await;
                None
            }
            Some(path) => match Embedder::shared(path, config.n_threads) {
                Ok(e) => Some(e),
                Err(e) => {
                    degrade(&pool, &e.to_string()).await;
                    None
                }
            },
        };
        MemoryService {
            pool,
            config,
            embedder,
            extractor: None,
        }
    }

    pub fn with_extractor(mut self, extractor: Arc<dyn Extractor>) -> MemoryService {
        self.extractor = Some(extractor);
        self
    }

    /// Embeds on a blocking thread; `None` when there is no embedder or it failed (the
    /// failure is recorded as an event and the caller continues lexically).
    pub async fn embed(&self, texts: Vec<String>, role: embed::Role) -> Option<Vec<Vec<f32>>> {
        self.embed_keeping(texts, role, embed::Keep::Start).await
    }

    /// [`MemoryService::embed`], keeping `keep`'s end of a text longer than the model's
    /// window.
    pub async fn embed_keeping(
        &self,
        texts: Vec<String>,
        role: embed::Role,
        keep: embed::Keep,
    ) -> Option<Vec<Vec<f32>>> {
        let embedder = self.embedder.clone()?;
        if texts.is_empty() {
            return Some(Vec::new());
        }
        let res =
            tokio::task::spawn_blocking(move || embedder.embed_keeping(&texts, role, keep)).await;
        let problem = match res {
            Ok(Ok(v)) => return Some(v),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        event(&self.pool, "memory_embedding_error", &problem, None).await;
        None
    }

    /// Gives a memory about to be written its vector, when there is an embedder (without
    /// one it is written lexical-only and `kvmem memory reindex` backfills it).
    pub async fn embed_memory(&self, m: &mut store::NewMemory) {
        if let Some(v) = self.embed(vec![m.embed_text()], embed::Role::Passage).await {
            m.embedding = v.into_iter().next();
            m.embed_model = self.model_id().map(str::to_string);
        }
    }

    /// The id stored with the vectors this service makes (the embedder file's sha256
    /// prefix); `None` without an embedder.
    pub fn model_id(&self) -> Option<&str> {
        self.embedder.as_deref().map(|e| e.id.as_str())
    }

    /// The embedder's cosine from which a line is about a query (recall's gate).
    pub fn related_cosine(&self) -> Option<f64> {
        self.embedder.as_deref().map(|e| e.related_cosine)
    }
}

async fn degrade(pool: &PgPool, reason: &str) {
    eprintln!(
        "WARNING: memory embedder unavailable ({reason}); search and import fall back to \
         lexical scoring until vectors are backfilled (`kvmem memory reindex`)"
    );
    event(pool, "memory_embedder_unavailable", reason, None).await;
}

/// The text a remember, forget or memory-line job carries; a job without one is invalid.
pub fn job_text<'a>(payload: &'a serde_json::Value, job: &str) -> Result<&'a str> {
    payload["text"]
        .as_str()
        .ok_or_else(|| MemoryError::Invalid(format!("{job} job without text")))
}

/// Records a memory-layer failure in `events`. Best effort: the events table may not
/// exist yet on a database the caller has not migrated.
pub async fn event(pool: &PgPool, kind: &str, reason: &str, user: Option<&str>) {
    let detail = serde_json::json!({ "reason": reason, "user_id": user });
    let res = sqlx::query(include_str!("../../sql/memory/event.sql"))
        .bind(kind)
        .bind(detail)
        .execute(pool)
        .await;
    if let Err(e) = res {
        tracing::warn!(kind, reason, error = %e, "could not record memory event");
    }
}
