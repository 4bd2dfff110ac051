//! A running turn's hold on its session, as the turn's own steps see it: whether to stop
//! now (the lease was lost, or shutdown ran out of grace), and, before a write that outlives
//! the turn, whether the lease is still held. The queue answers the check; the steps ask it
//! without knowing the queue.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;

/// Asks whoever keeps the lease whether this worker still holds it, unexpired.
pub trait LeaseCheck: Send + Sync {
    fn held(&self) -> BoxFuture<'_, Result<bool, sqlx::Error>>;
}

/// The lease handle a turn runs with: the abort flag its heartbeat sets, and the check a
/// step asks before it writes.
#[derive(Clone)]
pub struct Lease {
    abort: Arc<AtomicBool>,
    check: Arc<dyn LeaseCheck>,
}

impl Lease {
    pub fn new(abort: Arc<AtomicBool>, check: Arc<dyn LeaseCheck>) -> Lease {
        Lease { abort, check }
    }

    /// The flag the engine thread polls between decode steps.
    pub fn abort_flag(&self) -> &Arc<AtomicBool> {
        &self.abort
    }

    /// Whether the lease is still ours: false once the heartbeat gave up, else the keeper's
    /// answer. Not a proof (the worker can stall right after asking): the fence in the
    /// snapshot header, checked at load against the committing attempt's, is.
    pub async fn held(&self) -> Result<bool, sqlx::Error> {
        if self.abort.load(Ordering::Relaxed) {
            return Ok(false);
        }
        self.check.held().await
    }
}
