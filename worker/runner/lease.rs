//! The lease heartbeat of a running turn, and the lease handle the turn runs with: its
//! abort flag stops the generation once the lease is lost or shutdown has waited long
//! enough, and its check answers the save step's "is the lease still ours".

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::generator::Deps;
use crate::queue;
use crate::turn::{ClaimedTurn, Lease};

/// Heartbeats the lease while a turn runs. Sets `abort` when the lease is lost, or when
/// shutdown has waited its grace period, so a generation in flight stops early.
pub(super) struct LeaseKeeper {
    stop: CancellationToken,
    pub(super) lease: Lease,
}

impl LeaseKeeper {
    pub(super) fn spawn(
        deps: &Deps,
        turn: &ClaimedTurn,
        shutdown: CancellationToken,
    ) -> LeaseKeeper {
        let stop = CancellationToken::new();
        let abort = Arc::new(AtomicBool::new(false));
        let check = Arc::new(queue::SessionLease::new(deps.pool.clone(), turn.clone()));
        let lease = Lease::new(abort.clone(), check);
        let abort2 = abort.clone();
        let (pool, turn, settings, stop2) = (
            deps.pool.clone(),
            turn.clone(),
            deps.settings.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let abort = abort2;
            let beat = Duration::from_millis(settings.queue.heartbeat_ms);
            let grace = Duration::from_millis(settings.queue.shutdown_grace_ms);
            let grace_over = async {
                shutdown.cancelled().await;
                tokio::time::sleep(grace).await;
            };
            tokio::pin!(grace_over);
            // Until when the lease is surely ours: the claim's expiry, then each heartbeat's.
            let lease = Duration::from_millis(settings.queue.lease_ms);
            let mut held_until = tokio::time::Instant::now() + lease;
            loop {
                tokio::select! {
                    _ = stop2.cancelled() => return,
                    _ = &mut grace_over => {
                        abort.store(true, Ordering::Relaxed);
                        return;
                    }
                    _ = tokio::time::sleep(beat) => {}
                }
                let beat_started = tokio::time::Instant::now();
                match queue::heartbeat(&pool, &turn, settings.queue.lease_ms).await {
                    Ok(true) => held_until = beat_started + lease,
                    Ok(false) => {
                        warn!(turn_id = %turn.id, "lease lost; aborting the turn");
                        abort.store(true, Ordering::Relaxed);
                        return;
                    }
                    // A database blip: keep trying while the lease is still ours. Once it
                    // may have run out, another worker may own the session: stop at once.
                    Err(e) if tokio::time::Instant::now() >= held_until => {
                        warn!(turn_id = %turn.id, error = %e, "heartbeat failed past the lease; aborting the turn");
                        abort.store(true, Ordering::Relaxed);
                        return;
                    }
                    Err(e) => warn!(turn_id = %turn.id, error = %e, "heartbeat failed"),
                }
            }
        });
        LeaseKeeper { stop, lease }
    }

    pub(super) fn stop(self) {
        self.stop.cancel();
    }
}
