//! Work a worker does while no turn of its own is generating: the memory lane, then the
//! summary lane. Neither ever stands between a live turn and its engine; an extraction or
//! a summary already running when a turn arrives pauses until the turn is done.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::generator::Deps;
use crate::engine::{Busy, Engine};
use crate::lane;
use crate::memory::ingest::backfill::Reembed;
use crate::memory::MemoryService;
use crate::summary::jobs::SummaryLane;
use crate::summary::SummaryService;

/// The idle lanes: embedding, extraction and remember/forget jobs queued after turns
/// commit, and, when those are done, summary jobs (closes, rolling, session, spine). A job
/// is taken only while none of this worker's turns is generating, so lane work never
/// stands between a live turn and its engine (a job already running pauses its model
/// between decode steps while a turn generates; its database work finishes). One job at
/// a time: memory first, because summaries read what it writes.
pub(super) async fn idle_lanes(deps: Deps, slots: Arc<Semaphore>, shutdown: CancellationToken) {
    let memory = memory_service(&deps, &slots).await;
    let summary = summary_service(&deps, &slots).await;
    let all = deps.settings.queue.concurrency as usize;
    let rest = Duration::from_millis(deps.settings.queue.poll_ms.max(100));
    let mut reembed = Reembed::default();
    while !shutdown.is_cancelled() {
        let idle = slots.available_permits() == all;
        let worked = idle && {
            lane::step(memory.as_ref()).await
                || lane::step(summary.as_ref().map(SummaryLane::now).as_ref()).await
                || reembed_step(memory.as_ref(), &mut reembed).await
        };
        if !worked {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(rest) => {}
            }
        }
    }
}

/// Last of the idle work: vectors of the configured embedder for rows stored before it was
/// configured (a switch of embedder), a few at a time; true if it stored any.
async fn reembed_step(memory: Option<&MemoryService>, reembed: &mut Reembed) -> bool {
    let Some(svc) = memory else {
        return false;
    };
    if reembed.is_done() {
        return false;
    }
    match reembed.step(svc).await {
        Ok(n) => n > 0,
        Err(e) => {
            warn!(error = %e, "re-embedding step failed");
            false
        }
    }
}

async fn memory_service(deps: &Deps, slots: &Arc<Semaphore>) -> Option<MemoryService> {
    if !deps.settings.memory.lane {
        return None;
    }
    let busy = Some(turns_busy(deps, slots));
    match deps.services.memory_lane(chat_engine(deps), busy).await {
        Ok(svc) => Some(svc),
        Err(e) => {
            warn!(error = %e, "memory lane off: bad memory settings");
            None
        }
    }
}

/// The summary service, its model thread paused while any of this worker's turns holds a
/// slot: a summary already running gives way within one decode step.
async fn summary_service(deps: &Deps, slots: &Arc<Semaphore>) -> Option<SummaryService> {
    if !deps.settings.summary.lane {
        return None;
    }
    let busy = turns_busy(deps, slots);
    Some(deps.services.summary_lane(chat_engine(deps), busy).await)
}

/// The chat model's weights, which the lanes share when no model of their own is set.
fn chat_engine(deps: &Deps) -> Option<Arc<Engine>> {
    deps.engine.clone()
}

/// True while any of this worker's turns holds a slot.
fn turns_busy(deps: &Deps, slots: &Arc<Semaphore>) -> Busy {
    let (slots, all) = (slots.clone(), deps.settings.queue.concurrency as usize);
    Arc::new(move || slots.available_permits() < all)
}
