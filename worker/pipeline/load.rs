//! Step 2, loading the KV: find the session's snapshot and decide whether it may be
//! trusted (verified, made by this engine, and written by the attempt that committed the
//! session's last turn, which came with the claim). Every refusal is a cold start with its reason, and a cold
//! start rebuilds the committed dialogue exactly when this engine can, else from its text.

use tracing::{error, info, warn};

use super::event::event;
use super::history::{self, Recorded};
use super::kv::{ColdSource, Start};
use super::turn_ctx::TurnCtx;
use crate::engine::{Engine, LLAMA_BUILD};
use crate::snapshot::{self, Header, Loaded, SegKind, Snapshot};
use crate::turn::{short_sha, KvRecord, TurnError};

/// Where the turn's KV comes from, and why it starts cold when it does. `base_prompt` is
/// the turn's: a recorded dialogue is rebuilt exactly only if it starts with it.
pub(super) async fn start(
    cx: &TurnCtx<'_>,
    base_prompt: &str,
    file: Option<Loaded>,
) -> Result<(Start, Option<String>), TurnError> {
    let Some(file) = file else {
        // The rollback path re-reads the dialogue text on every turn, by design.
        let exchanges = history::recent(cx.db, &cx.turn.session_id).await?;
        let reason = "KV_ONLY_ENABLED=false".to_string();
        return Ok((Start::Cold(ColdSource::Text(exchanges)), Some(reason)));
    };
    match check_snapshot(cx, file).await {
        (Some(snap), _) => Ok((Start::Snapshot(snap), None)),
        (None, reason) => {
            let reason = reason.unwrap_or_else(|| "no snapshot".to_string());
            cold_start(cx, base_prompt, reason).await
        }
    }
}

/// A cold start: the recorded dialogue of the last committed turn when this engine can
/// decode it as recorded, else the text of `messages`, with the reason in `cold_reason`.
pub(super) async fn cold_start(
    cx: &TurnCtx<'_>,
    base_prompt: &str,
    reason: String,
) -> Result<(Start, Option<String>), TurnError> {
    let Some((last, _)) = cx.turn.last_done else {
        // A first turn: there is no dialogue to rebuild.
        return Ok((Start::Cold(ColdSource::Text(Vec::new())), Some(reason)));
    };
    let why_text = match history::recorded(cx.db, &cx.turn.session_id).await? {
        Some(Ok(recorded)) => match exact_fit(cx, base_prompt, last, recorded) {
            Ok(record) => return Ok((Start::Cold(ColdSource::Exact(record)), Some(reason))),
            Err(why) => why.to_string(),
        },
        Some(Err(why)) => why.to_string(),
        None => "no recorded KV dialogue".to_string(),
    };
    info!(%why_text, "cold start rebuilds the dialogue from its text");
    let exchanges = history::recent(cx.db, &cx.turn.session_id).await?;
    let reason = format!("{reason}; text rebuild: {why_text}");
    Ok((Start::Cold(ColdSource::Text(exchanges)), Some(reason)))
}

/// Why a session's recorded dialogue cannot be decoded back exactly: the cold start then
/// rebuilds from the dialogue's text, and says why in its reason.
#[derive(Debug, thiserror::Error)]
enum NotExact {
    #[error("the recorded dialogue is of turn {recorded}, the last committed turn is {last}")]
    OtherTurn { recorded: i64, last: i64 },
    #[error("the recorded dialogue belongs to another scope")]
    OtherScope,
    #[error("model changed: recorded with {recorded}, this engine runs {here}")]
    ModelChanged { recorded: String, here: String },
    #[error("the recorded dialogue ({tokens} tokens) exceeds N_CTX {n_ctx}")]
    TooLong { tokens: usize, n_ctx: u32 },
    #[error("base prompt changed")]
    BaseChanged,
}

/// The recorded dialogue, if this engine reproduces it token for token; else why not.
fn exact_fit(
    cx: &TurnCtx<'_>,
    base_prompt: &str,
    last: i64,
    recorded: Recorded,
) -> Result<KvRecord, NotExact> {
    let (engine, turn) = (cx.engine, cx.turn);
    let record = recorded.record;
    if recorded.turn_id != last {
        // Turns committed without a record (the echo generator) leave an older one.
        return Err(NotExact::OtherTurn {
            recorded: recorded.turn_id,
            last,
        });
    }
    if recorded.user_id != turn.user_id || recorded.character_id != turn.character_id {
        return Err(NotExact::OtherScope);
    }
    if record.model_sha != engine.model_sha {
        return Err(NotExact::ModelChanged {
            recorded: short_sha(&record.model_sha).to_string(),
            here: short_sha(&engine.model_sha).to_string(),
        });
    }
    if record.token_ids.len() as u32 > cx.settings.engine.n_ctx {
        return Err(NotExact::TooLong {
            tokens: record.token_ids.len(),
            n_ctx: cx.settings.engine.n_ctx,
        });
    }
    let base: Vec<i32> = engine
        .base_tokens(base_prompt)
        .iter()
        .map(|t| t.0)
        .collect();
    let base_kept = record
        .segments
        .first()
        .is_some_and(|s| s.kind == SegKind::Base && s.len as usize == base.len())
        && record.token_ids.starts_with(&base);
    if !base_kept {
        return Err(NotExact::BaseChanged);
    }
    Ok(record)
}

/// The session's snapshot as the store resolves it: the local copy, or the object store's
/// when the cached one is not the last committed turn's; with where it came from. `None` on
/// the rollback path, which never reads one. It needs nothing from the turn's other inputs,
/// so it runs while they are gathered; whether it may be trusted is decided after.
pub(super) async fn load(cx: &TurnCtx<'_>) -> Option<(Loaded, snapshot::Source)> {
    if !cx.settings.turn.kv_only_enabled {
        return None;
    }
    let read = cx.store.read(cx.scope).await;
    let last_done = cx.turn.last_done;
    let current = |h: &Header| Some((h.turn_id, Some(h.fence))) == last_done;
    Some(cx.store.resolve(cx.scope, read, current).await)
}

/// Checks the session's snapshot file. Any problem means a cold start, with the reason.
async fn check_snapshot(
    cx: &TurnCtx<'_>,
    loaded: Loaded,
) -> (Option<Box<Snapshot>>, Option<String>) {
    let last_done = cx.turn.last_done;
    let snap = match loaded {
        Loaded::Missing => return (None, Some("no snapshot".into())),
        Loaded::Unreadable(e) => {
            error!(error = %e, "snapshot unreadable");
            return (None, Some(format!("snapshot unreadable: {e}")));
        }
        Loaded::Corrupt { error, quarantined } => {
            warn!(%error, quarantined = ?quarantined, "snapshot corrupt; quarantined");
            event(
                cx.db,
                cx.turn,
                "snapshot_quarantined",
                serde_json::json!({ "error": error.to_string(), "file": quarantined }),
            )
            .await;
            return (None, Some(format!("corrupt snapshot: {error}")));
        }
        Loaded::Found(snap) => snap,
    };
    if let Some(reason) = foreign(cx.engine, cx.settings.engine.kv_type.as_str(), &snap.header) {
        // Valid, but made for another model, KV type, format or llama.cpp build: kept
        // aside for inspection, and the session starts over on this engine.
        let quarantined = cx.store.quarantine(cx.scope).await;
        info!(%reason, quarantined = ?quarantined, "snapshot header mismatch; cold start");
        event(
            cx.db,
            cx.turn,
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
    if snap.header.kv_device != cx.engine.placement.kv_device {
        // Same layout on every device (docs/operations.md#snapshots-across-devices): it
        // loads, and the reply goes on from the other device's numbers.
        info!(made_on = %snap.header.kv_device, here = %cx.engine.placement.kv_device,
            "snapshot made on another device; resuming from it");
    }
    (Some(snap), None)
}

/// Why a verified snapshot cannot be restored into this engine, if it cannot.
fn foreign(engine: &Engine, kv: &str, h: &Header) -> Option<String> {
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
