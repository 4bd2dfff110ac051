//! The services the turn path and a worker's lanes build on first use, named as a trait so
//! that the layers below the composition root ask for them and never construct one:
//! [`crate::system`] holds the one implementation and hands it down in the worker's
//! dependencies.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::engine::{Busy, Engine};
use crate::memory::{MemoryError, MemoryService};
use crate::summary::SummaryService;

/// A service being built (an embedder or a model may load on a blocking thread).
pub type Building<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait Services: Send + Sync {
    /// The memory service of recall and the in-chat commands, with the embedder; an error
    /// is a bad memory setting.
    fn memory(&self) -> Building<'_, Result<MemoryService, MemoryError>>;

    /// The memory lane's service: [`Services::memory`] with the extraction model when
    /// extraction is on, sharing `chat_engine`'s weights when no model of its own is set.
    /// Its model thread pauses while `busy` says live turns need the cores.
    fn memory_lane(
        &self,
        chat_engine: Option<Arc<Engine>>,
        busy: Option<Busy>,
    ) -> Building<'_, Result<MemoryService, MemoryError>>;

    /// The summary lane's service: the configured summary model, or else `chat_engine`'s
    /// weights, pausing while `busy`. A model that cannot start leaves a service without
    /// one (summaries degrade), never an error.
    fn summary_lane(
        &self,
        chat_engine: Option<Arc<Engine>>,
        busy: Busy,
    ) -> Building<'_, SummaryService>;
}
