//! The memory layer's run-time handle and its settings: search, ingest and notes all run
//! on a [`MemoryService`], so it lives below them in a file of its own, not in the
//! folder's `mod.rs` that declares those rooms.

use std::path::PathBuf;
use std::sync::Arc;

use sqlx::PgPool;

use super::columns::Columns;
use super::embed::{self, Embedder};
use super::error::Result;
use super::events::event;
use super::extractor::Extractor;
use super::ranker::RankerKind;
use super::store;
use crate::config::Settings;
use crate::engine::GpuChoice;

/// Memory settings, from [`Settings`].
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    pub embed_model_path: Option<PathBuf>,
    pub ranker: RankerKind,
    pub keep_user: i64,
    pub keep_lore: i64,
    pub exact_search_max: i64,
    pub n_threads: i32,
    /// The embedder's layers on a GPU (`memory.embed_gpu_layers` on `engine.main_gpu`).
    pub embed_gpu: GpuChoice,
}

impl MemoryConfig {
    pub fn from_settings(s: &Settings) -> Result<MemoryConfig> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as i32);
        Ok(MemoryConfig {
            embed_model_path: s.memory.embed_model_path.clone(),
            ranker: s.memory.ranker.into(),
            keep_user: i64::from(s.memory.keep_user),
            keep_lore: i64::from(s.memory.keep_lore),
            exact_search_max: i64::from(s.memory.exact_search_max),
            n_threads: if s.engine.n_threads == 0 {
                cores
            } else {
                s.engine.n_threads as i32
            },
            embed_gpu: GpuChoice {
                layers: s.memory.embed_gpu_layers,
                main_gpu: s.engine.main_gpu,
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

    /// The message-vector columns of the embedder's width (the narrow ones without an
    /// embedder: no vector of `model_id` None is ever read).
    pub fn columns(&self) -> Columns {
        self.embedder
            .as_deref()
            .and_then(|e| Columns::of_width(e.dims))
            .unwrap_or(Columns::NARROW)
    }

    /// The embedder's cosine from which a line is about a query (recall's gate).
    pub fn related_cosine(&self) -> Option<f64> {
        self.embedder.as_deref().map(|e| e.related_cosine)
    }
}
