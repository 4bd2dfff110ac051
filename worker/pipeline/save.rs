//! Step 6: write the new snapshot, but only while this worker still holds the session's
//! lease, and stamped with the attempt's fencing token; the turn's log gets its size and time.

use std::time::Instant;

use tracing::{error, warn};

use super::kv::TurnRun;
use super::turn_ctx::TurnCtx;
use crate::engine::LLAMA_BUILD;
use crate::snapshot::{self, Compression, Header};
use crate::turn::log::KvLog;
use crate::turn::TurnError;

/// Saves the run's pruned KV (when it exported one) while the lease is still ours, and
/// logs its size and time; a save the lease lost aborts the turn.
pub(super) async fn save_state(
    cx: &TurnCtx<'_>,
    log: &mut KvLog,
    run: &TurnRun,
) -> Result<(), TurnError> {
    let Some(state) = &run.state else {
        return Ok(());
    };
    let saved_at = Instant::now();
    log.kv_bytes = state.len() as u64;
    log.bpt = (state.len() / run.token_ids.len().max(1)) as u32;
    if !save(cx, run).await {
        return Err(TurnError::Aborted);
    }
    log.save_ms = saved_at.elapsed().as_millis() as u64;
    Ok(())
}

/// Writes the snapshot while this worker still holds the lease. A failed save is
/// logged, never fatal: the next turn starts cold. Returns false when the lease is gone
/// (the turn must stop: another worker owns the session).
async fn save(cx: &TurnCtx<'_>, run: &TurnRun) -> bool {
    let Some(state) = run.state.clone() else {
        return true;
    };
    crate::faults::stop_point("before_save");
    let held = cx.lease.held().await.unwrap_or_else(|e| {
        warn!(error = %e, "could not check the lease before saving; not saving");
        false
    });
    if !held {
        warn!("lease lost before the snapshot save; the session's snapshot is left alone");
        return false;
    }
    let (s, turn) = (cx.settings, cx.turn);
    let mut header = Header::new(&cx.engine.model_sha, LLAMA_BUILD, cx.scope)
        .with_kv(s.engine.n_ctx, s.engine.kv_type.as_str())
        .with_kv_device(&cx.engine.placement.kv_device)
        .with_turn(turn.id.0, turn.fencing_token)
        .with_digest(&run.kv_digest_version)
        .with_segments(run.segments.clone())
        .with_compression(if s.snapshot.compress {
            Compression::Zstd
        } else {
            Compression::None
        })
        .with_timestamp(chrono::Utc::now().timestamp().max(0) as u64);
    let tokens = run.token_ids.clone();
    let encoded =
        tokio::task::spawn_blocking(move || snapshot::encode(&mut header, &tokens, &state)).await;
    let result = match encoded {
        Ok(Ok(file)) => cx
            .store
            .save(cx.scope, file, crate::faults::stop_point)
            .await
            .map_err(|e| e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(format!("panicked: {e}")),
    };
    match result {
        Ok(_) => crate::faults::stop_point("after_save"),
        Err(e) => error!(error = %e, "snapshot save failed; the next turn will start cold"),
    }
    true
}
