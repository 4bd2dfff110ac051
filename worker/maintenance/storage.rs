//! Storage upkeep, about once a minute: keeps the snapshot directory
//! under its cap (files another worker sharing it wrote count too), deletes quarantined
//! snapshots past their retention, and the rows finished turns and jobs no longer need.
//! What it removed is counted in `/metrics` and in `kvmem_storage_counts` for
//! `kvmem status`.

use std::time::Duration;

use tracing::warn;

use super::chore::{Chore, Housekeeping, SWEEP_EVERY};
use super::rows::{self, Retained, Retention};
use crate::config::Settings;
use crate::snapshot::QuarantineSwept;

/// What one storage sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StorageSwept {
    /// Snapshot files evicted to stay under the cap since the last sweep.
    pub evictions: u64,
    pub quarantine: QuarantineSwept,
    pub rows: Retained,
    /// The snapshot directory's bytes after the sweep; none without snapshots.
    pub snapshot_bytes: Option<u64>,
}

/// One storage sweep. `evictions_counted` is the eviction count already added to the
/// database's totals, carried from sweep to sweep. A failed part is logged and the rest
/// still runs: upkeep never stops a worker.
pub async fn sweep_storage(deps: &Housekeeping, evictions_counted: &mut u64) -> StorageSwept {
    let mut swept = StorageSwept::default();
    if let Some(store) = &deps.snapshots {
        let days = deps.settings.maintenance.quarantine_days;
        if days > 0 {
            match store
                .sweep_quarantine(Duration::from_secs(days * 86400))
                .await
            {
                Ok(q) => swept.quarantine = q,
                Err(e) => warn!(error = %e, "quarantine retention failed"),
            }
        }
        let store = store.clone();
        let held = tokio::task::spawn_blocking(move || (store.reconcile(), store))
            .await
            .ok();
        if let Some((bytes, store)) = held {
            swept.snapshot_bytes = Some(bytes);
            let total = store.counters().evictions.get();
            swept.evictions = total.saturating_sub(*evictions_counted);
        }
    }
    let q = &deps.settings.maintenance;
    let retention = Retention {
        finished_hours: q.finished_retention_hours,
        failed_hours: q.failed_retention_hours,
        log_hours: q.log_retention_hours,
    };
    match rows::retain(&deps.pool, retention).await {
        Ok(rows) => swept.rows = rows,
        Err(e) => warn!(error = %e, "row retention failed"),
    }
    let by_table = swept.rows.by_table();
    deps.metrics.storage_swept(&by_table, swept.snapshot_bytes);
    let mut counts: Vec<(String, u64)> = by_table
        .iter()
        .map(|(table, n)| (format!("rows_removed.{table}"), *n))
        .collect();
    counts.push(("snapshot_evictions".into(), swept.evictions));
    let removed = swept.quarantine.files + swept.quarantine.objects;
    counts.push(("quarantine_removed".into(), removed));
    match rows::count(&deps.pool, &counts).await {
        Ok(()) => *evictions_counted += swept.evictions,
        Err(e) => warn!(error = %e, "could not record the storage sweep's counts"),
    }
    swept
}

/// The storage sweep as a chore, carrying the evictions already counted.
#[derive(Default)]
pub(super) struct Storage {
    evictions_counted: u64,
}

impl Chore for Storage {
    const NAME: &'static str = "storage";

    fn every(&self, _: &Settings) -> Duration {
        SWEEP_EVERY
    }

    async fn run(&mut self, house: &Housekeeping) {
        sweep_storage(house, &mut self.evictions_counted).await;
    }
}
