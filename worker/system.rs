//! One place builds a running system from settings: the database pool (migrated), the
//! model, the generator and the worker's dependencies. `kvmem worker`, the demo, the
//! tests and the benchmarks all start through here, so they run the same wiring.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::config::{Settings, SnapshotStoreKind};
use crate::engine::{Engine, EngineError, EngineParams};
use crate::metrics::Metrics;
use crate::pipeline::TurnPipeline;
use crate::runner::{Deps, Generator};
use crate::snapshot::{self, Limits, SnapshotStore};

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
    Ok(crate::db::connect(settings.database_url()?, connections).await?)
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
    let path: PathBuf = settings.model_path.clone().ok_or(SystemError::NoModel)?;
    let params = EngineParams::from_settings(settings);
    let pinned = settings.model_sha.clone();
    let engine =
        tokio::task::spawn_blocking(move || Engine::load(&path, pinned.as_deref(), params))
            .await??;
    tracing::info!(
        model_sha = %crate::turn::short_sha(&engine.model_sha),
        model = %engine.model_path.display(),
        "model loaded"
    );
    Ok(Arc::new(engine))
}

/// The worker's dependencies: `model` behind the generator, counted in `metrics`.
pub fn deps(
    pool: PgPool,
    settings: Arc<Settings>,
    model: Model,
    worker_id: String,
    metrics: Arc<Metrics>,
) -> Result<Deps, SystemError> {
    let engine = match model {
        Model::Echo { delay } => {
            return Ok(Deps {
                pool,
                settings,
                generator: Generator::Echo { delay },
                worker_id,
                metrics,
            })
        }
        Model::Llama(engine) => engine,
    };
    let places = settings.engine_slots * settings.batch_sessions;
    if settings.concurrency > places {
        tracing::warn!(
            "concurrency above engine_slots x batch_sessions: extra turns wait for a free context"
        );
    } else if settings.batch_sessions > 1 && settings.concurrency < places {
        tracing::warn!(
            concurrency = settings.concurrency,
            batch_sessions = settings.batch_sessions,
            "concurrency below engine_slots x batch_sessions: batches can never fill"
        );
    }
    let store = snapshot_store(&settings, &metrics)?;
    let pipeline = TurnPipeline::new(
        engine,
        settings.clone(),
        pool.clone(),
        metrics.clone(),
        store,
    )?;
    Ok(Deps {
        pool,
        settings,
        generator: Generator::Llama(Arc::new(pipeline)),
        worker_id,
        metrics,
    })
}

/// The snapshot store the settings name: files in `kv_dir`, or an S3-compatible object
/// store with `kv_dir` as the cache in front of it, counting into `metrics`.
fn snapshot_store(settings: &Settings, metrics: &Metrics) -> Result<SnapshotStore, SystemError> {
    let limits = Limits {
        max_tokens: settings.n_ctx,
        // f32 K+V of a large model is well under 1 MiB per token.
        max_state_bytes: settings.n_ctx as u64 * (1 << 20),
    };
    match settings.snapshot_store {
        SnapshotStoreKind::Local => Ok(SnapshotStore::local(&settings.kv_dir, limits)),
        SnapshotStoreKind::S3 => {
            let config = snapshot::RemoteConfig {
                endpoint: settings.s3_endpoint.clone(),
                bucket: settings.s3_bucket.clone().unwrap_or_default(),
                region: settings.s3_region.clone(),
                access_key_id: settings.s3_access_key_id.clone(),
                secret_access_key: settings.s3_secret_access_key.clone(),
                prefix: settings.s3_prefix.clone(),
                timeout: std::time::Duration::from_millis(settings.s3_timeout_ms),
                cache_bytes: settings.kv_cache_bytes,
            };
            SnapshotStore::remote(&settings.kv_dir, limits, &config, metrics.snapshot_cache())
                .map_err(|e| SystemError::Settings(format!("snapshot store: {e}")))
        }
    }
}
