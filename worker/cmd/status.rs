//! `kvmem status`: the monitoring views in `sql/views/queue.sql` and the storage upkeep's
//! totals, printed for people.

use std::fmt::Write;

use sqlx::PgPool;

use crate::queue::{self, QueueError};

/// Renders the queue's state as text.
pub async fn report(pool: &PgPool) -> Result<String, sqlx::Error> {
    let mut out = String::new();
    let counts = queue::state_counts(pool)
        .await
        .map_err(QueueError::into_db)?;
    let _ = writeln!(out, "turns by state:");
    for (state, turns) in &counts {
        let _ = writeln!(out, "  {state:<8} {turns}");
    }
    let oldest = queue::oldest_queued(pool)
        .await
        .map_err(QueueError::into_db)?;
    let _ = writeln!(out, "oldest queued:");
    if oldest.is_empty() {
        let _ = writeln!(out, "  (queue empty)");
    }
    for (lane, age_s, queued) in &oldest {
        let _ = writeln!(out, "  {lane:<7} {age_s:.1}s ({queued} queued)");
    }
    let running = queue::running_turns(pool)
        .await
        .map_err(QueueError::into_db)?;
    let _ = writeln!(out, "running ({}):", running.len());
    for r in &running {
        let _ = writeln!(
            out,
            "  turn {} sid={} owner={} lease_age={:.1}s expires_in={:.1}s",
            r.turn_id,
            r.session_id,
            r.owner.as_deref().unwrap_or_default(),
            r.lease_age_s,
            r.expires_in_s
        );
    }
    let dead = queue::dead_turns(pool).await.map_err(QueueError::into_db)?;
    let _ = writeln!(out, "dead ({} shown):", dead.len());
    for r in &dead {
        let _ = writeln!(
            out,
            "  turn {} sid={} attempts={} error={}",
            r.turn_id,
            r.session_id,
            r.attempts,
            r.error.as_deref().unwrap_or_default()
        );
    }
    let (turns, p50_ms, p95_ms) = queue::latency(pool).await.map_err(QueueError::into_db)?;
    let (warm, cold) = queue::warm_cold(pool).await.map_err(QueueError::into_db)?;
    let _ = writeln!(
        out,
        "last hour: {turns} ok turns, p50 {:.0} ms, p95 {:.0} ms, warm {warm} / cold {cold}",
        p50_ms.unwrap_or(0.0),
        p95_ms.unwrap_or(0.0)
    );
    out.push_str(&super::summary::status_report(pool).await?);
    Ok(out)
}

/// The storage upkeep's totals (every worker's, from `kvmem_storage_counts`) and the bytes
/// the snapshot files in `store`'s directory hold on this host now.
pub async fn storage(
    pool: &PgPool,
    store: &crate::snapshot::SnapshotStore,
) -> Result<String, sqlx::Error> {
    let mut out = String::new();
    let dir = store.files().dir();
    let files = store.files().list().unwrap_or_default();
    let bytes: u64 = files.iter().map(|(_, len)| len).sum();
    let _ = writeln!(
        out,
        "snapshots: {} files, {bytes} bytes in {}",
        files.len(),
        dir.display()
    );
    let totals = crate::maintenance::storage_totals(pool).await?;
    let _ = writeln!(out, "storage upkeep, all workers:");
    if totals.is_empty() {
        let _ = writeln!(out, "  (nothing removed yet)");
    }
    for (name, value) in &totals {
        let _ = writeln!(out, "  {name:<24} {value}");
    }
    Ok(out)
}
