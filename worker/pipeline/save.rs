//! Step 5's file half: write the new snapshot, but only while this worker still holds the
//! session's lease, and stamped with the attempt's fencing token.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{error, warn};

use super::kv::TurnRun;
use super::TurnPipeline;
use crate::engine::LLAMA_BUILD;
use crate::snapshot::{self, Compression, Header};
use crate::turn::ClaimedTurn;

impl TurnPipeline {
    /// Writes the snapshot while this worker still holds the lease. A failed save is
    /// logged, never fatal: the next turn starts cold. Returns false when the lease is gone
    /// (the turn must stop: another worker owns the session).
    pub(super) async fn save(
        &self,
        scope: &str,
        turn: &ClaimedTurn,
        run: &TurnRun,
        abort: &AtomicBool,
    ) -> bool {
        let Some(state) = run.state.clone() else {
            return true;
        };
        crate::faults::stop_point("before_save");
        let held = !abort.load(Ordering::Relaxed)
            && crate::queue::lease_held(&self.db, turn)
                .await
                .unwrap_or_else(|e| {
                    warn!(error = %e, "could not check the lease before saving; not saving");
                    false
                });
        if !held {
            warn!("lease lost before the snapshot save; the session's snapshot is left alone");
            return false;
        }
        let s = &self.settings;
        let mut header = Header::new(&self.engine().model_sha, LLAMA_BUILD, scope)
            .with_kv(s.n_ctx, s.kv_type.as_str())
            .with_turn(turn.id.0, turn.fencing_token)
            .with_digest(&run.kv_digest_version)
            .with_segments(run.segments.clone())
            .with_compression(if s.kv_compress {
                Compression::Zstd
            } else {
                Compression::None
            })
            .with_timestamp(chrono::Utc::now().timestamp().max(0) as u64);
        let tokens = run.token_ids.clone();
        let encoded =
            tokio::task::spawn_blocking(move || snapshot::encode(&mut header, &tokens, &state))
                .await;
        let result = match encoded {
            Ok(Ok(file)) => self
                .store
                .save(scope, file, crate::faults::stop_point)
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
}
