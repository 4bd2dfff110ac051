//! One place builds a running system from settings: the database pool (migrated, or
//! checked for a command that only reads), the model, the generator and the worker's
//! dependencies. `kvmem worker`, the demo, the tests and the benchmarks all start through
//! here, so they run the same wiring.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::config::{Settings, SnapshotStoreKind};
use crate::engine::{Busy, Engine, EngineError, EngineParams};
use crate::memory::ingest::llm::LlmExtractor;
use crate::memory::{Embedder, MemoryConfig, MemoryError, MemoryService};
use crate::metrics::Metrics;
use crate::pipeline::TurnPipeline;
use crate::runner::{Deps, Echo};
use crate::services::{Building, Services};
use crate::snapshot::{self, Limits, SnapshotStore};
use crate::summary::llm::Summarizer;
use crate::summary::{SummaryConfig, SummaryError, SummaryService};

/// Why a system could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error("KVMEM_MODEL_PATH is not set (run ops/fetch-model for SmolLM2)")]
    NoModel,
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("model loading stopped: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("settings: {0}")]
    Settings(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// What replies to turns.
pub enum Model {
    /// The echo generator, for queue mechanics only: no model, no snapshots.
    Echo { delay: Duration },
    /// Seed 000's pipeline on a loaded model ([`load_model`] loads the configured one;
    /// tests and benchmarks share one per process).
    Llama(Arc<Engine>),
}

/// A pool on `settings`' database with room for `connections`, as it is (not migrated):
/// every command and service gets its pool here, so there is one place that opens one.
pub async fn connect(settings: &Settings, connections: u32) -> Result<PgPool, SystemError> {
    connect_url(settings.database_url()?, connections).await
}

/// [`connect`] on a URL the caller holds rather than settings: a test's own throwaway
/// cluster, a benchmark's scratch database, a pool per simulated worker process.
pub async fn connect_url(url: &str, connections: u32) -> Result<PgPool, SystemError> {
    let pool = crate::db::connect(url, connections).await?;
    if let Ok(mut opened) = opened().lock() {
        *opened.entry(url.to_string()).or_default() += 1;
    }
    Ok(pool)
}

/// How many pools this process has opened on `url` through [`connect`]: one per command or
/// worker, however many services it runs (the wiring's own test reads it).
pub fn pools_opened(url: &str) -> usize {
    opened()
        .lock()
        .map(|o| o.get(url).copied().unwrap_or(0))
        .unwrap_or(0)
}

fn opened() -> &'static std::sync::Mutex<std::collections::HashMap<String, usize>> {
    static OPENED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, usize>>> =
        std::sync::OnceLock::new();
    OPENED.get_or_init(Default::default)
}

/// [`connect`], then migrates the database.
pub async fn database(settings: &Settings, connections: u32) -> Result<PgPool, SystemError> {
    let pool = match connect(settings, connections).await {
        Err(SystemError::Config(e)) => return Err(SystemError::Settings(e.to_string())),
        other => other?,
    };
    crate::db::migrate(&pool).await?;
    Ok(pool)
}

/// [`connect`] for a command that only reads: it never migrates, and fails naming
/// `kvmem migrate` when the schema is behind this binary (`command` is how the message
/// names the command that refused).
pub async fn connect_current(
    settings: &Settings,
    connections: u32,
    command: &str,
) -> Result<PgPool, SystemError> {
    let pool = connect(settings, connections).await?;
    crate::db::require_current(&pool, command).await?;
    Ok(pool)
}

/// [`database`] for a long-running worker: while the server is unavailable (down,
/// starting, restarting) it waits and tries again, from 250 ms doubling to 5 s, until the
/// server answers or `shutdown` fires (`Ok(None)`). Workers are started beside their
/// database, and one that came up a moment early must not exit. Other errors return at once.
pub async fn database_when_ready(
    settings: &Settings,
    connections: u32,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<Option<PgPool>, SystemError> {
    let mut wait = Duration::from_millis(250);
    let mut attempt = 0u64;
    loop {
        attempt += 1;
        match database(settings, connections).await {
            Ok(pool) => return Ok(Some(pool)),
            Err(SystemError::Db(e)) if e.is_unavailable() => {
                tracing::warn!(attempt, retry_in_ms = wait.as_millis() as u64, error = %e,
                    "database unavailable at start; waiting for it");
            }
            Err(e) => return Err(e),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return Ok(None),
        }
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

/// Loads the configured model off the async runtime, checking the pinned SHA if set.
pub async fn load_model(settings: &Settings) -> Result<Arc<Engine>, SystemError> {
    let path: PathBuf = settings
        .engine
        .model_path
        .clone()
        .ok_or(SystemError::NoModel)?;
    let params = EngineParams::from_settings(settings);
    let pinned = settings.engine.model_sha.clone();
    let engine =
        tokio::task::spawn_blocking(move || Engine::load(&path, pinned.as_deref(), params))
            .await??;
    tracing::info!(
        model_sha = %crate::turn::short_sha(&engine.model_sha),
        model = %engine.model_path.display(),
        backend = %engine.placement.backend,
        device = %engine.placement.device,
        device_description = %engine.placement.description,
        gpu_layers = engine.placement.offloaded_layers,
        layers = engine.placement.layers,
        "model loaded"
    );
    no_gpu_found(
        "engine.gpu_layers",
        settings.engine.gpu_layers,
        &engine.placement,
    );
    Ok(Arc::new(engine))
}

/// Layers were asked of a GPU and none was found: the model runs on the CPU (a build
/// without a GPU feature, or a machine without the device), which an operator should hear.
fn no_gpu_found(setting: &str, layers: u32, placement: &crate::engine::Placement) {
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

/// The worker's dependencies: `model` behind the generator, counted in `metrics`.
pub fn deps(
    pool: PgPool,
    settings: Arc<Settings>,
    model: Model,
    worker_id: String,
    metrics: Arc<Metrics>,
) -> Result<Deps, SystemError> {
    let services: Arc<dyn Services> = Arc::new(Wiring {
        pool: pool.clone(),
        settings: settings.clone(),
    });
    let engine = match model {
        Model::Echo { delay } => {
            return Ok(Deps {
                pool,
                settings,
                generator: Arc::new(Echo { delay }),
                engine: None,
                snapshots: None,
                worker_id,
                metrics,
                services,
            })
        }
        Model::Llama(engine) => engine,
    };
    let places = settings.engine.slots * settings.engine.batch_sessions;
    if settings.queue.concurrency > places {
        tracing::warn!(
            "concurrency above engine_slots x batch_sessions: extra turns wait for a free context"
        );
    } else if settings.engine.batch_sessions > 1 && settings.queue.concurrency < places {
        tracing::warn!(
            concurrency = settings.queue.concurrency,
            batch_sessions = settings.engine.batch_sessions,
            "concurrency below engine_slots x batch_sessions: batches can never fill"
        );
    }
    let store = snapshot_store(&settings, &metrics)?;
    let pipeline = TurnPipeline::new(
        engine,
        settings.clone(),
        pool.clone(),
        metrics.clone(),
        store.clone(),
        services.clone(),
    )?;
    Ok(Deps {
        pool,
        settings,
        engine: Some(pipeline.engine().clone()),
        snapshots: Some(store),
        generator: Arc::new(pipeline),
        worker_id,
        metrics,
        services,
    })
}

/// The snapshot store the settings name: files in `snapshot.dir`, or an S3-compatible object
/// store with that folder as the cache in front of it, counting into `metrics`.
pub fn snapshot_store(
    settings: &Settings,
    metrics: &Metrics,
) -> Result<SnapshotStore, SystemError> {
    let limits = Limits {
        max_tokens: settings.engine.n_ctx,
        // f32 K+V of a large model is well under 1 MiB per token.
        max_state_bytes: settings.engine.n_ctx as u64 * (1 << 20),
    };
    let snap = &settings.snapshot;
    match snap.store {
        SnapshotStoreKind::Local => Ok(SnapshotStore::local(
            &snap.dir,
            limits,
            snap.cache_bytes,
            metrics.snapshot_cache(),
        )),
        SnapshotStoreKind::S3 => {
            let config = snapshot::RemoteConfig {
                endpoint: snap.s3_endpoint.clone(),
                bucket: snap.s3_bucket.clone().unwrap_or_default(),
                region: snap.s3_region.clone(),
                access_key_id: snap.s3_access_key_id.clone(),
                secret_access_key: snap.s3_secret_access_key.clone(),
                prefix: snap.s3_prefix.clone(),
                timeout: std::time::Duration::from_millis(snap.s3_timeout_ms),
            };
            let cap = snap.cache_bytes;
            SnapshotStore::remote(&snap.dir, limits, &config, cap, metrics.snapshot_cache())
                .map_err(|e| SystemError::Settings(format!("snapshot store: {e}")))
        }
    }
}

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
struct Wiring {
    pool: PgPool,
    settings: Arc<Settings>,
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
