//! Wake-ups: NOTIFY on enqueue wakes the claim loop.

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
