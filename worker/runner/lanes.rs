//! Work a worker does while no turn of its own is generating: the memory lane. It never
//! stands between a live turn and its engine.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Deps;

/// The memory lane: embedding, extraction and remember/forget jobs queued after turns
/// commit. It takes a job only while none of this worker's turns is generating, so memory
/// work never stands between a live turn and its engine (a job already running finishes).
pub(super) async fn memory_lane(deps: Deps, slots: Arc<Semaphore>, shutdown: CancellationToken) {
    let svc = match crate::memory::worker_service(deps.pool.clone(), &deps.settings).await {
        Ok(svc) => svc,
        Err(e) => {
            warn!(error = %e, "memory lane off: bad memory settings");
            shutdown.cancelled().await;
            return;
        }
    };
    let all = deps.settings.concurrency as usize;
    let rest = Duration::from_millis(deps.settings.poll_ms.max(100));
    while !shutdown.is_cancelled() {
        let idle = slots.available_permits() == all;
        let worked = if idle {
            match crate::memory::jobs::process_next_memory_job(&svc).await {
                Ok(crate::memory::jobs::Outcome::Empty) => false,
                Ok(_) => true,
                Err(e) => {
                    warn!(error = %e, "memory job failed");
                    false
                }
            }
        } else {
            false
        };
        if !worked {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(rest) => {}
            }
        }
    }
}
