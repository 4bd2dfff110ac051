//! The builder: [`build`] turns settings and the caller's role into an [`App`], the one
//! value `main`'s commands, `serve`, the demo, the tests and the benchmarks take their
//! pool, snapshot store, models, HTTP state and worker dependencies from.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::error::SystemError;
use super::pools;
use super::services::{no_gpu_found, Wiring};
use crate::config::{Settings, SnapshotStoreKind};
use crate::engine::{Engine, EngineError, EngineParams};
use crate::http::AppState;
use crate::metrics::Metrics;
use crate::pipeline::TurnPipeline;
use crate::runner::{Deps, Echo};
use crate::services::Services;
use crate::snapshot::{self, Limits, SnapshotStore};

/// Who is starting, which decides how the pool is opened.
pub enum Role<'a> {
    /// `kvmem worker` and `kvmem serve`: migrates, and waits for a database that is down
    /// until it answers or `shutdown` fires ([`SystemError::Stopped`]).
    Server {
        connections: u32,
        shutdown: &'a CancellationToken,
    },
    /// A command that writes: migrates first.
    Writer { connections: u32 },
    /// A command that only reads: never migrates, and refuses a schema behind this binary,
    /// naming `command`.
    Reader { connections: u32, command: &'a str },
    /// A command that takes the database as it finds it (`migrate --status`, `summary`,
    /// which checks per subcommand).
    AsIs { connections: u32 },
    /// A pool the caller already holds: a test's throwaway database, a benchmark's.
    Pool(PgPool),
}

/// A running system's parts, built once by [`build`]: cheap to clone.
#[derive(Clone)]
pub struct App {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    /// Where the system counts (the process-wide registry unless a test sets its own).
    pub metrics: Arc<Metrics>,
    snapshots: Arc<OnceLock<SnapshotStore>>,
}

/// The one way in: the pool `role` calls for on `settings`' database, and the rest made
/// on first use from the same settings.
pub async fn build(settings: Arc<Settings>, role: Role<'_>) -> Result<App, SystemError> {
    let pool = match role {
        Role::Server {
            connections,
            shutdown,
        } => pools::database_when_ready(&settings, connections, shutdown)
            .await?
            .ok_or(SystemError::Stopped)?,
        Role::Writer { connections } => pools::database(&settings, connections).await?,
        Role::Reader {
            connections,
            command,
        } => pools::connect_current(&settings, connections, command).await?,
        Role::AsIs { connections } => pools::connect(&settings, connections).await?,
        Role::Pool(pool) => pool,
    };
    Ok(App::on(pool, settings))
}

impl App {
    /// The system on a pool the caller already holds (a test's throwaway database, a
    /// benchmark's scratch one), counting into the process-wide registry.
    pub fn on(pool: PgPool, settings: Arc<Settings>) -> App {
        App {
            pool,
            settings,
            metrics: crate::metrics::global(),
            snapshots: Arc::new(OnceLock::new()),
        }
    }

    /// Counts into `metrics` instead (a test's own registry, to read back exactly).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> App {
        self.metrics = metrics;
        self
    }

    /// The snapshot store the settings name, made once and shared by whatever this system
    /// runs (the worker's turns, the rotate hint, erase, status), so that one cache index
    /// sees every write and removal.
    pub fn snapshots(&self) -> Result<SnapshotStore, SystemError> {
        if let Some(store) = self.snapshots.get() {
            return Ok(store.clone());
        }
        let store = snapshot_store(&self.settings, &self.metrics)?;
        Ok(self.snapshots.get_or_init(|| store).clone())
    }

    /// The HTTP API's state on this system: its pool, settings, metrics and snapshot
    /// store. `model_sha` is what `/v1/info` reports ("" without a model).
    pub fn http(&self, model_sha: String) -> Result<AppState, SystemError> {
        Ok(AppState::new(
            self.pool.clone(),
            self.settings.clone(),
            model_sha,
            self.snapshots()?,
        )
        .with_metrics(self.metrics.clone()))
    }

    /// The worker's dependencies: `model` behind the generator, on this system's pool,
    /// snapshot store and metrics.
    pub fn deps(&self, model: Model, worker_id: String) -> Result<Deps, SystemError> {
        let (pool, settings, metrics) = (
            self.pool.clone(),
            self.settings.clone(),
            self.metrics.clone(),
        );
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
        let store = self.snapshots()?;
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
}

/// What replies to turns.
pub enum Model {
    /// The echo generator, for queue mechanics only: no model, no snapshots.
    Echo { delay: Duration },
    /// Seed 000's pipeline on a loaded model ([`load_model`] loads the configured one;
    /// tests and benchmarks share one per process).
    Llama(Arc<Engine>),
}

/// The snapshot files in `dir` alone, without a cache index or an object store: for the
/// benchmarks that time the file store's own reads and writes.
pub fn snapshot_files(dir: &Path, limits: Limits) -> snapshot::FileStore {
    snapshot::FileStore::new(dir, limits)
}

/// The one call that loads a model file into an engine (the chat model, a summary or
/// extraction model, a test's or a benchmark's): on the caller's thread, which should not
/// be an async one.
pub fn load_engine(
    path: &Path,
    pinned_sha: Option<&str>,
    params: EngineParams,
) -> Result<Engine, EngineError> {
    Engine::load(path, pinned_sha, params)
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
    let engine = tokio::task::spawn_blocking(move || load_engine(&path, pinned.as_deref(), params))
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
