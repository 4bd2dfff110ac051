//! Steps 1–3 of a turn in a one-sequence context: the KV restored from its snapshot or
//! laid back cold, pruned, and given the HUD and the blocks due, up to the message.

use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;

use crate::engine::{Engine, KvSession};
use crate::pipeline::history;
use crate::snapshot::{SegKind, Snapshot};
use crate::turn::log::Rebuild;
use crate::turn::TurnError;

use super::blocks::{budget, context_block, digest_block, recall_block, Blocks, Injected};
use super::job::{ColdSource, LoadedKv, Start, TurnJob};
use super::prepared::{Opened, Prepared};

/// Steps 1–3 in a one-sequence context, all but the message: the KV restored or rebuilt,
/// pruned, and given the HUD and the blocks due.
pub(super) fn prepare<'e, 'c>(
    engine: &'e Engine,
    ctx: &'c mut LlamaContext<'static>,
    job: TurnJob,
    start: Start,
) -> Result<Opened<'e, 'c>, TurnError> {
    let step_started = Instant::now();
    let blocks = Blocks::new(engine, &job);

    // 1. Load KV: warm from the snapshot, else rebuilt cold.
    let (mut session, warm_digest, cold) = match start {
        Start::Snapshot(snap) => match restore(engine, ctx, &snap, &blocks.base) {
            Ok(session) => (session, snap.header.digest_version.clone(), None),
            Err(why) => return Ok(Opened::Refused(why.to_string())),
        },
        Start::Cold(source) => (KvSession::empty(engine, ctx), String::new(), Some(source)),
    };
    let tokens_loaded = session.len();
    let load_ms = step_started.elapsed().as_millis() as u64;
    let prefill_started = Instant::now();
    let loaded = match cold {
        None => LoadedKv {
            rebuild: None,
            seen_digest: Some(warm_digest),
        },
        Some(source) => lay_back(engine, &mut session, source, &blocks, job.tail)?,
    };

    // The last save left the HUD at the KV's end: an unchanged one is already what the
    // model must see, so only a changed (or missing) one is decoded again.
    let hud_kept = session.trailing_hud() == Some(&blocks.hud[..]);
    if !hud_kept {
        session.drop_hud()?;
    }

    // 3 (decided before the prune, which must leave room for them). The digest and the
    // context go in only when the KV has not seen their versions, or they were pruned away.
    let mut injected = Injected {
        digest: digest_block(engine, &job, &session, &loaded),
        context: context_block(engine, &job, &session),
        recall: None,
    };
    // Recall is sized after the prune (which may drop a recall segment the KV held), so
    // the prune leaves room for a whole recall block whenever there are candidates.
    let recall_room = if job.recall.is_empty() {
        0
    } else {
        job.recall_max
    };

    // 2. Prune: HUD + digest + context + recall + KV + user + reply <= N_CTX, and the KV
    // within its tail.
    let (need, recall_room) = budget(engine, &job, &blocks, hud_kept, &mut injected, recall_room)?;
    session.prune_to(job.tail.min(engine.params.n_ctx - need))?;
    let mut recall_in_kv = 0;
    if recall_room > 0 {
        (injected.recall, recall_in_kv) = recall_block(engine, &job, &session);
    }

    let hud_start = build_context(&mut session, &blocks, hud_kept, &injected)?;
    Ok(Opened::Ready(
        session,
        Box::new(Prepared {
            job,
            blocks,
            loaded,
            injected,
            tokens_loaded,
            load_ms,
            prefill_started,
            hud_kept,
            hud_start,
            recall_in_kv,
        }),
    ))
}

/// Step 3, building the context: the HUD (unless the KV ends with it), digest, context
/// and recall (when due); the message is the caller's. Returns where the HUD starts.
fn build_context(
    session: &mut KvSession,
    blocks: &Blocks,
    hud_kept: bool,
    injected: &Injected,
) -> Result<u32, TurnError> {
    if !hud_kept {
        session.append(&blocks.hud, Some(SegKind::Hud))?;
    }
    let hud_start = session.len() - blocks.hud.len() as u32;
    if injected.any() {
        // Injected blocks go between the HUD and the message: the user block's opening,
        // which ends the HUD segment, leaves the end of the KV first (no shift needed).
        session.truncate_tail(session.len() - blocks.opener as u32)?;
        if let Some(tokens) = &injected.digest {
            session.append(tokens, Some(SegKind::Digest))?;
        }
        if let Some((tokens, version)) = &injected.context {
            session.append_segment(tokens, SegKind::Context, version)?;
        }
        if let Some((tokens, keys)) = &injected.recall {
            session.append_segment(tokens, SegKind::Recall, &keys.join("."))?;
        }
    }
    Ok(hud_start)
}

/// A cold start's step 1: the recorded dialogue decoded as recorded, or the text rebuilt.
fn lay_back(
    engine: &Engine,
    session: &mut KvSession,
    source: ColdSource,
    blocks: &Blocks,
    tail: u32,
) -> Result<LoadedKv, TurnError> {
    Ok(match source {
        ColdSource::Exact(record) => {
            history::decode_exact(session, &record)?;
            LoadedKv {
                rebuild: Some(Rebuild::Exact),
                seen_digest: Some(record.digest_version),
            }
        }
        ColdSource::Text(exchanges) => {
            session.append(&blocks.base, Some(SegKind::Base))?;
            let budget = tail.saturating_sub(blocks.close.len() as u32);
            history::rebuild(engine, session, &exchanges, budget)?;
            LoadedKv {
                rebuild: Some(Rebuild::Text),
                seen_digest: None,
            }
        }
    })
}

/// Why a trusted snapshot was not restored: the turn goes on as a cold start.
#[derive(Debug, thiserror::Error)]
enum Unrestored {
    #[error("base prompt changed")]
    BaseChanged,
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
}

/// Restores the snapshot when its base prompt still matches; otherwise why not. A failed
/// restore leaves the context in an unknown state: the cold retry's empty KV clears it.
fn restore<'e, 'c>(
    engine: &'e Engine,
    ctx: &'c mut LlamaContext<'static>,
    snap: &Snapshot,
    base: &[LlamaToken],
) -> Result<KvSession<'e, 'c>, Unrestored> {
    let prefix_ok = snap.token_ids.len() >= base.len()
        && snap.token_ids[..base.len()]
            .iter()
            .zip(base)
            .all(|(a, b)| *a == b.0);
    if !prefix_ok {
        return Err(Unrestored::BaseChanged);
    }
    Ok(KvSession::restore(
        engine,
        ctx,
        &snap.state,
        &snap.token_ids,
        &snap.header.segments,
    )?)
}
