//! The services a running system is made of (long-term memory, summaries), each built
//! from the settings and a pool, with its model loaded off the async threads; and the
//! [`Services`] wiring that lets the turn path and the lanes build them when first asked.

use std::sync::Arc;

use sqlx::PgPool;

use crate::config::Settings;
use crate::engine::{Busy, Engine, EngineParams};
use crate::memory::ingest::llm::LlmExtractor;
use crate::memory::{Embedder, MemoryConfig, MemoryError, MemoryService};
use crate::services::{Building, Services};
use crate::summary::llm::Summarizer;
use crate::summary::{SummaryConfig, SummaryError, SummaryService};

/// The memory service `settings` describe: the one place `main`, the turn pipeline, the
/// memory lane and the CLI make it. `load_embedder: false` is for commands that never
/// embed, so they neither load the model nor warn that it is missing.
pub async fn memory_service(
    pool: PgPool,
    settings: &Settings,
    load_embedder: bool,
) -> Result<MemoryService, MemoryError> {
    let config = MemoryConfig::from_settings(settings)?;
    if !load_embedder {
        return Ok(memory_service_on(pool, config, None));
    }
    Ok(memory_service_loading(pool, config).await)
}

/// A memory service on `config` that takes the process's embedder (loaded on first use,
/// then shared by every service) if it can. A missing or broken model file is not an error
/// (graceful degradation): a loud warning on stderr, an event row, and retrieval falls back
/// to lexical scoring.
pub async fn memory_service_loading(pool: PgPool, config: MemoryConfig) -> MemoryService {
    let embedder = match &config.embed_model_path {
        None => {
            embedder_missing(&pool, "no memory_embed_model_path configured").await;
            None
        }
        Some(path) => {
            // The first load hashes and maps the whole file (a second or more for e5): off
            // the async threads, so a turn's lease heartbeat keeps beating meanwhile.
            let (path, n_threads, gpu) = (path.clone(), config.n_threads, config.embed_gpu);
            let loaded =
                tokio::task::spawn_blocking(move || Embedder::shared_on(&path, n_threads, gpu))
                    .await
                    .unwrap_or_else(|e| {
                        Err(crate::memory::embed::EmbedError::Llama(format!(
                            "embedder load panicked: {e}"
                        )))
                    });
            match loaded {
                Ok(e) => {
                    tracing::info!(embedder = %e.name, backend = %e.placement.backend,
                        device = %e.placement.device, gpu_layers = e.placement.offloaded_layers,
                        "embedder loaded");
                    no_gpu_found(
                        "memory.embed_gpu_layers",
                        config.embed_gpu.layers,
                        &e.placement,
                    );
                    Some(e)
                }
                Err(e) => {
                    embedder_missing(&pool, &e.to_string()).await;
                    None
                }
            }
        }
    };
    memory_service_on(pool, config, embedder)
}

/// A memory service over an embedder the caller already holds, or none (lexical only):
/// tests and benchmarks that share one loaded model across many services.
pub fn memory_service_on(
    pool: PgPool,
    config: MemoryConfig,
    embedder: Option<Arc<Embedder>>,
) -> MemoryService {
    MemoryService {
        pool,
        config,
        embedder,
        extractor: None,
    }
}

async fn embedder_missing(pool: &PgPool, reason: &str) {
    eprintln!(
        "WARNING: memory embedder unavailable ({reason}); search and import fall back to \
         lexical scoring until vectors are backfilled (`kvmem memory reindex`)"
    );
    crate::memory::event(pool, "memory_embedder_unavailable", reason, None).await;
}

/// The memory service a llama worker runs its memory lane with: the embedder, and the
/// extraction model when `memory.extract` is on: the configured extraction model, or else
/// `chat_engine`, the chat model's weights shared with the turn pipeline (not loaded a
/// second time). The model's thread pauses while `busy` says live turns need the cores. A
/// model that fails to load is logged and left out (the lane still embeds), never fatal.
pub async fn memory_lane_service(
    pool: PgPool,
    settings: &Settings,
    chat_engine: Option<Arc<Engine>>,
    busy: Option<Busy>,
) -> Result<MemoryService, MemoryError> {
    let svc = memory_service(pool, settings, true).await?;
    if !settings.memory.extract {
        return Ok(svc);
    }
    let own_path = settings.memory.extract_model_path.clone();
    let started = match (own_path, chat_engine) {
        (None, Some(engine)) => {
            tokio::task::spawn_blocking(move || LlmExtractor::start(engine, busy)).await
        }
        (path, _) => {
            let Some(path) = path.or_else(|| settings.engine.model_path.clone()) else {
                tracing::warn!(
                    "memory_extract is on but no extraction or chat model is configured"
                );
                return Ok(svc);
            };
            let params = EngineParams::from_settings(settings);
            tokio::task::spawn_blocking(move || {
                let engine = Engine::load(&path, None, params)?;
                LlmExtractor::start(Arc::new(engine), busy)
            })
            .await
        }
    };
    match started {
        Ok(Ok(extractor)) => Ok(svc.with_extractor(Arc::new(extractor))),
        Ok(Err(e)) => {
            crate::memory::event(&svc.pool, "memory_extract_error", &e.to_string(), None).await;
            tracing::warn!(error = %e, "extraction model not loaded; the memory lane only embeds");
            Ok(svc)
        }
        Err(e) => {
            tracing::warn!(error = %e, "extraction model load panicked");
            Ok(svc)
        }
    }
}

/// The summary service with the configured summary model, loaded on a blocking thread. A
/// model that fails to load is an event and a service without a model, never fatal.
pub async fn summary_service(
    pool: PgPool,
    settings: &Settings,
    busy: Option<Busy>,
) -> SummaryService {
    let config = SummaryConfig::from_settings(settings);
    let Some(path) = config.model_path.clone() else {
        return summary_unavailable(pool, config, "no model configured".into()).await;
    };
    let params = EngineParams::from_settings(settings);
    let loaded = tokio::task::spawn_blocking(move || {
        let engine = Engine::load(&path, None, params).map_err(|e| e.to_string())?;
        Summarizer::start(Arc::new(engine), busy).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    match loaded {
        Ok(llm) => summary_service_of(pool, config, Some(Arc::new(llm))),
        Err(e) => summary_unavailable(pool, config, e).await,
    }
}

/// A summary service on `engine`, already loaded (tests, benchmarks), whose model thread
/// gives way while `busy` says live turns need the cores. No engine: a service whose every
/// summary job fails with a recorded reason, and the user context degrades to what the
/// database holds.
pub fn summary_service_on(
    pool: PgPool,
    config: SummaryConfig,
    engine: Option<Arc<Engine>>,
    busy: Option<Busy>,
) -> Result<SummaryService, SummaryError> {
    let llm = match engine {
        None => None,
        Some(engine) => Some(Arc::new(
            Summarizer::start(engine, busy).map_err(|e| SummaryError::Model(e.to_string()))?,
        )),
    };
    Ok(summary_service_of(pool, config, llm))
}

fn summary_service_of(
    pool: PgPool,
    config: SummaryConfig,
    llm: Option<Arc<Summarizer>>,
) -> SummaryService {
    let caches = Arc::new(crate::summary::cache::Caches::new(config.cache_capacity));
    SummaryService {
        pool,
        config,
        llm,
        caches,
    }
}

/// The service a llama worker runs its summary lane with: the configured summary model, or
/// else `chat_engine`, the chat model's weights shared with the turn pipeline (a context of
/// its own). Its model thread pauses while `busy` is true.
pub async fn summary_lane_service(
    pool: PgPool,
    settings: &Settings,
    chat_engine: Option<Arc<Engine>>,
    busy: Busy,
) -> SummaryService {
    let shared = chat_engine.filter(|_| settings.summary.model_path.is_none());
    let Some(engine) = shared else {
        return summary_service(pool, settings, Some(busy)).await;
    };
    let config = SummaryConfig::from_settings(settings);
    match summary_service_on(pool.clone(), config.clone(), Some(engine), Some(busy)) {
        Ok(svc) => svc,
        Err(e) => summary_unavailable(pool, config, e.to_string()).await,
    }
}

/// A service without a model, after recording why: summaries degrade, the worker goes on.
async fn summary_unavailable(
    pool: PgPool,
    config: SummaryConfig,
    reason: String,
) -> SummaryService {
    tracing::warn!(%reason, "no summary model; summaries degrade");
    crate::summary::event(
        &pool,
        "summary_model_unavailable",
        serde_json::json!({"reason": reason}),
    )
    .await;
    summary_service_of(pool, config, None)
}

/// The worker's [`Services`]: each one built from the worker's pool and settings, by the
/// functions above, when the turn path or a lane first asks.
pub(super) struct Wiring {
    pub(super) pool: PgPool,
    pub(super) settings: Arc<Settings>,
}

impl Services for Wiring {
    fn memory(&self) -> Building<'_, Result<MemoryService, MemoryError>> {
        Box::pin(memory_service(self.pool.clone(), &self.settings, true))
    }

    fn memory_lane(
        &self,
        chat_engine: Option<Arc<Engine>>,
        busy: Option<Busy>,
    ) -> Building<'_, Result<MemoryService, MemoryError>> {
        Box::pin(memory_lane_service(
            self.pool.clone(),
            &self.settings,
            chat_engine,
            busy,
        ))
    }

    fn summary_lane(
        &self,
        chat_engine: Option<Arc<Engine>>,
        busy: Busy,
    ) -> Building<'_, SummaryService> {
        Box::pin(summary_lane_service(
            self.pool.clone(),
            &self.settings,
            chat_engine,
            busy,
        ))
    }
}

/// Layers were asked of a GPU and none was found: the model runs on the CPU (a build
/// without a GPU feature, or a machine without the device), which an operator should hear.
pub(super) fn no_gpu_found(setting: &str, layers: u32, placement: &crate::engine::Placement) {
    if layers > 0 && placement.offloaded_layers == 0 {
        tracing::warn!(
            setting,
            layers,
            gpu_devices = crate::engine::device::gpu_devices().len(),
            "GPU layers asked for, but llama.cpp lists no GPU device (a build without \
             --features vulkan or cuda, or no device); the model runs on the CPU"
        );
    }
}
