//! Wake-ups and housekeeping: NOTIFY on enqueue wakes the claim loop, and the reaper
//! requeues turns whose lease expired and trims old events.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::generator::Deps;
use crate::queue;

/// Turns NOTIFY on enqueue into wake-ups; the poll in [`claim_loop`] covers any gap.
pub(super) async fn listen_for_turns(deps: Deps, wake: Arc<Notify>, shutdown: CancellationToken) {
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        match listen_once(&deps.pool, &wake, &shutdown).await {
            Ok(()) => return,
            Err(e) => {
                failures = (failures + 1).min(8);
                warn!(error = %e, "turn listener lost; reconnecting");
                // Anything enqueued while we were away is found by the claim loop's poll.
                wake.notify_waiters();
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(50 << failures)) => {}
                }
            }
        }
    }
}

async fn listen_once(
    pool: &PgPool,
    wake: &Notify,
    shutdown: &CancellationToken,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(queue::TURNS_CHANNEL).await?;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            n = listener.try_recv() => match n? {
                Some(_) => wake.notify_one(),
                // The connection dropped and was re-established: we may have missed wake-ups.
                None => wake.notify_waiters(),
            }
        }
    }
}

pub(super) async fn reaper(deps: Deps, wake: Arc<Notify>, shutdown: CancellationToken) {
    let every = Duration::from_millis(deps.settings.queue.reaper_ms);
    let (mut last_upkeep, mut evictions_counted) = (None::<std::time::Instant>, 0);
    let mut erased_mark = crate::erase::SweepMark::default();
    while !shutdown.is_cancelled() {
        match queue::reap(&deps.pool).await {
            Ok(reaped) if !reaped.is_empty() => {
                deps.metrics.reaped(reaped.len());
                for r in &reaped {
                    warn!(turn_id = %r.turn_id, sid = %r.session_id, state = ?r.state, "reaped expired lease");
                }
                wake.notify_waiters();
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "reaper failed"),
        }
        if let Err(e) =
            queue::trim_events(&deps.pool, deps.settings.queue.events_retention_hours).await
        {
            warn!(error = %e, "event retention failed");
        }
        if let Err(e) = crate::stream::trim(&deps.pool).await {
            warn!(error = %e, "reply delta retention failed");
        }
        if last_upkeep.is_none_or(|at| at.elapsed() >= super::upkeep::UPKEEP_EVERY) {
            // Erased scopes first: what the cap counts next is what is left.
            deps.generator.sweep_erased(&deps, &mut erased_mark).await;
            super::upkeep::sweep_storage(&deps, &mut evictions_counted).await;
            last_upkeep = Some(std::time::Instant::now());
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
