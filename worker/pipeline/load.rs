//! Step 1's database and file half: find the session's snapshot and decide whether it may
//! be trusted (verified, made by this engine, and written by the attempt that committed
//! the session's last turn). Every refusal is a cold start with its reason.

use tracing::{error, info, warn};

use super::{event, TurnPipeline};
use crate::engine::LLAMA_BUILD;
use crate::snapshot::{self, Header, Loaded, Snapshot};
use crate::turn::{short_sha, ClaimedTurn};

impl TurnPipeline {
    /// Reads and checks the session's snapshot. Any problem means a cold start, with the reason.
    pub(super) async fn load_snapshot(
        &self,
        turn: &ClaimedTurn,
        scope: &str,
        last_done: Option<(i64, Option<i64>)>,
    ) -> (Option<Box<Snapshot>>, Option<String>) {
        let store = self.store.clone();
        let scope2 = scope.to_string();
        let loaded = match tokio::task::spawn_blocking(move || store.load(&scope2)).await {
            Ok(l) => l,
            Err(e) => return (None, Some(format!("snapshot load panicked: {e}"))),
        };
        let snap = match loaded {
            Loaded::Missing => return (None, Some("no snapshot".into())),
            Loaded::Unreadable(e) => {
                error!(error = %e, "snapshot unreadable");
                return (None, Some(format!("snapshot unreadable: {e}")));
            }
            Loaded::Corrupt { error, quarantined } => {
                warn!(%error, quarantined = ?quarantined, "snapshot corrupt; quarantined");
                event(
                    &self.db,
                    turn,
                    "snapshot_quarantined",
                    serde_json::json!({ "error": error.to_string(), "file": quarantined }),
                )
                .await;
                return (None, Some(format!("corrupt snapshot: {error}")));
            }
            Loaded::Found(snap) => snap,
        };
        if let Some(reason) = self.foreign(&snap.header) {
            // Valid, but made for another model, KV type, format or llama.cpp build: kept
            // aside for inspection, and the session starts over on this engine.
            let quarantined = self.store.quarantine(scope);
            info!(%reason, quarantined = ?quarantined, "snapshot header mismatch; cold start");
            event(
                &self.db,
                turn,
                "snapshot_quarantined",
                serde_json::json!({ "error": format!("header mismatch: {reason}"), "file": quarantined }),
            )
            .await;
            return (None, Some(format!("header mismatch: {reason}")));
        }
        if Some((snap.header.turn_id, Some(snap.header.fence))) != last_done {
            // Normal after a crash between save and commit (the file is fine, just not
            // current), and what a worker paused past its lease leaves behind: the same turn,
            // another attempt's token. Only the committing attempt's KV matches `messages`.
            let reason = format!(
                "stale: snapshot holds turn {} (fence {}), last committed turn is {}",
                snap.header.turn_id,
                snap.header.fence,
                match last_done {
                    Some((id, Some(token))) => format!("{id} (fence {token})"),
                    Some((id, None)) => format!("{id} (no fence recorded)"),
                    None => "none".to_string(),
                }
            );
            info!(%reason, "snapshot is not current; cold start");
            return (None, Some(reason));
        }
        (Some(snap), None)
    }

    /// Why a verified snapshot cannot be restored into this engine, if it cannot.
    fn foreign(&self, h: &Header) -> Option<String> {
        let engine = self.engine();
        let kv = self.settings.kv_type.as_str();
        if h.format_version != snapshot::FORMAT_VERSION {
            Some(format!(
                "format version {} != {}",
                h.format_version,
                snapshot::FORMAT_VERSION
            ))
        } else if h.model_sha != engine.model_sha {
            Some(format!(
                "model_sha {} != {}",
                short_sha(&h.model_sha),
                short_sha(&engine.model_sha)
            ))
        } else if h.type_k != kv || h.type_v != kv {
            Some(format!("KV type {}/{} != {kv}", h.type_k, h.type_v))
        } else if h.llama_build != LLAMA_BUILD {
            Some(format!(
                "llama.cpp build {} != {LLAMA_BUILD}",
                h.llama_build
            ))
        } else {
            None
        }
    }
}
