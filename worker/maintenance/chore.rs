//! What every housekeeping chore shares: the worker's parts it works with, the trait a
//! chore implements, and the loop that runs one on its tick.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::metrics::Metrics;
use crate::snapshot::SnapshotStore;

/// How often the storage and erased-scope sweeps run: each lists the snapshot directory
/// (and the bucket), too costly for every reaper tick.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// What housekeeping works with: one worker's pool, settings, metrics and snapshot store.
#[derive(Clone)]
pub struct Housekeeping {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    /// None for a worker without snapshots (the echo generator).
    pub snapshots: Option<SnapshotStore>,
}

/// One housekeeping component: its name in logs and metrics, its tick, and one run.
pub(super) trait Chore: Send + 'static {
    const NAME: &'static str;

    fn every(&self, settings: &Settings) -> Duration;

    fn run(&mut self, house: &Housekeeping) -> impl Future<Output = ()> + Send;
}

/// Runs `chore` on its tick until `shutdown`, counting each run.
pub(super) async fn every<C: Chore>(
    mut chore: C,
    house: Housekeeping,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        chore.run(&house).await;
        house.metrics.maintenance_ran(C::NAME);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(chore.every(&house.settings)) => {}
        }
    }
}
