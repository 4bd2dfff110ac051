//! The reaper's tick: turns whose lease expired go back to the queue (a worker died or
//! stalled mid-turn), and events and reply deltas past their window are trimmed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tracing::warn;

use super::chore::{Chore, Housekeeping};
use crate::config::Settings;
use crate::queue;

/// Requeues turns whose lease expired, and wakes the claim loop for them.
pub(super) struct Leases {
    pub(super) wake: Arc<Notify>,
}

impl Chore for Leases {
    const NAME: &'static str = "leases";

    fn every(&self, settings: &Settings) -> Duration {
        Duration::from_millis(settings.maintenance.reaper_ms)
    }

    async fn run(&mut self, house: &Housekeeping) {
        match queue::reap(&house.pool).await {
            Ok(reaped) if !reaped.is_empty() => {
                house.metrics.reaped(reaped.len());
                for r in &reaped {
                    warn!(turn_id = %r.turn_id, sid = %r.session_id, state = ?r.state, "reaped expired lease");
                }
                self.wake.notify_waiters();
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "reaper failed"),
        }
    }
}

/// Deletes events and reply deltas past their window, a bounded batch per tick.
pub(super) struct Trim;

impl Chore for Trim {
    const NAME: &'static str = "trim";

    fn every(&self, settings: &Settings) -> Duration {
        Duration::from_millis(settings.maintenance.reaper_ms)
    }

    async fn run(&mut self, house: &Housekeeping) {
        let hours = house.settings.maintenance.events_retention_hours;
        if let Err(e) = queue::trim_events(&house.pool, hours).await {
            warn!(error = %e, "event retention failed");
        }
        if let Err(e) = crate::stream::trim(&house.pool).await {
            warn!(error = %e, "reply delta retention failed");
        }
    }
}
