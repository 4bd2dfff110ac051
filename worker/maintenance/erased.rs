//! The erased-scope sweep: what this worker's snapshot store still holds of erased
//! sessions, characters and users (a snapshot written by a turn that raced the erase, a
//! file of a worker that was down) is removed, each scope once per worker.

use std::time::Duration;

use super::chore::{Chore, Housekeeping, SWEEP_EVERY};
use crate::config::Settings;
use crate::erase::{SweepMark, Swept};

/// How long an erased snapshot scope is remembered for the workers' sweeps: far longer
/// than any turn in flight, or a worker that was down, takes to sweep its directory.
pub const ERASED_SCOPES_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Sweeps erased scopes; remembers which it swept, and forgets scopes erased longer than
/// [`ERASED_SCOPES_KEPT`] ago.
#[derive(Default)]
pub(super) struct Erased {
    mark: SweepMark,
}

impl Chore for Erased {
    const NAME: &'static str = "erased";

    fn every(&self, _: &Settings) -> Duration {
        SWEEP_EVERY
    }

    async fn run(&mut self, house: &Housekeeping) {
        let Some(store) = &house.snapshots else {
            return;
        };
        let swept = crate::erase::sweep(&house.pool, store, ERASED_SCOPES_KEPT, &mut self.mark);
        match swept.await {
            Ok(Swept { scopes, removed: r }) if r.files + r.quarantined + r.objects > 0 => {
                tracing::info!(
                    scopes,
                    files = r.files,
                    quarantined = r.quarantined,
                    objects = r.objects,
                    "removed snapshots of erased sessions"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "erased-snapshot sweep failed; it runs again"),
        }
    }
}
