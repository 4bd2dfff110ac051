//! What every route handler gets: the server's state, and the small request helpers the
//! handlers share.

use std::sync::Arc;

use axum::http::HeaderMap;
use sqlx::PgPool;
use tokio::sync::broadcast;

use super::error::ApiError;
use crate::config::Settings;

/// What the server needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    /// SHA-256 of the configured model file ("" when no model is configured).
    pub model_sha: String,
    /// What `/metrics` renders: the process-wide registry unless set otherwise.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Long-term memory for `/v1/memory/*` (503 there without it).
    pub memory: Option<Arc<crate::memory::MemoryService>>,
    /// The system's snapshot store (`system::App`'s, which the in-process worker shares,
    /// so its cache index sees erase's removals): what `/v1/erase` empties and the rotate
    /// hint reads.
    pub snapshots: crate::snapshot::SnapshotStore,
    /// Where each model this process loaded runs (`chat`, `embedder`), for `/v1/info`.
    pub placements: Vec<(&'static str, crate::engine::Placement)>,
    pub(super) done: broadcast::Sender<i64>,
    /// The LISTEN connection streamed replies are followed through.
    pub(super) hub: crate::stream::Hub,
    /// Test hooks: scripted failures of the chat endpoint (none in production).
    pub(super) faults: Arc<crate::faults::HttpFaults>,
}

impl AppState {
    /// Only the builder makes one (`system::App::http`), so every server runs on the
    /// system's shared parts.
    pub(crate) fn new(
        pool: PgPool,
        settings: Arc<Settings>,
        model_sha: String,
        snapshots: crate::snapshot::SnapshotStore,
    ) -> AppState {
        let (done, _) = broadcast::channel(4096);
        AppState {
            hub: crate::stream::Hub::new(pool.clone()),
            pool,
            settings,
            model_sha,
            metrics: crate::metrics::global(),
            memory: None,
            snapshots,
            placements: Vec::new(),
            done,
            faults: Arc::new(crate::faults::HttpFaults::from_env()),
        }
    }

    /// Serves `/v1/memory/*` from this memory service.
    pub fn with_memory(mut self, memory: Arc<crate::memory::MemoryService>) -> AppState {
        self.memory = Some(memory);
        self
    }

    /// Names where the model loaded as `role` runs in `/v1/info`.
    pub fn with_placement(
        mut self,
        role: &'static str,
        placement: crate::engine::Placement,
    ) -> AppState {
        self.placements.push((role, placement));
        self
    }

    /// Serves `/v1/erase` and the rotate hint over this snapshot store instead: a worker's
    /// built apart from this state (a test's).
    pub fn with_snapshots(mut self, store: crate::snapshot::SnapshotStore) -> AppState {
        self.snapshots = store;
        self
    }

    /// Fails chat requests as `faults` scripts (the retry tests).
    pub fn with_faults(mut self, faults: crate::faults::HttpFaults) -> AppState {
        self.faults = Arc::new(faults);
        self
    }

    /// A scripted failure at `point` (`KVMEM_TEST_HTTP_FAULTS`; none in production).
    pub(super) fn fault(&self, point: &str) -> Result<(), ApiError> {
        match self.faults.take(point) {
            Some(status) => Err(ApiError::fault(status, point)),
            None => Ok(()),
        }
    }

    /// Renders `metrics` at `/metrics` (a worker's own registry, in tests).
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> AppState {
        self.metrics = metrics;
        self
    }
}

/// A request header as text, if present and printable.
pub(super) fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}
