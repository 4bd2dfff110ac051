//! The engine-side half of a turn, run on an engine thread: seed 000's steps 1–5 inside one
//! llama.cpp context, from a restored or rebuilt KV to the state the save step writes.
//! Nothing here touches Postgres or files; [`super::TurnPipeline`] brings the inputs.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;

use super::history;
use crate::context::digest;
use crate::engine::{Engine, GenStats, KvSession};
use crate::snapshot::{self, SegKind, Snapshot};
use crate::turn::TurnError;

/// What the engine thread needs for one turn.
pub struct TurnJob {
    pub base_prompt: String,
    pub hud: String,
    pub digest: digest::Stored,
    pub user: String,
    pub snapshot: Option<Box<Snapshot>>,
    /// Recent exchanges, oldest first, for a cold start.
    pub history: Vec<(String, String)>,
    pub tail: u32,
    pub reply_max: u32,
    pub export: bool,
}

/// What the engine thread produced.
#[derive(Debug)]
pub struct TurnRun {
    pub reply: String,
    pub token_ids: Vec<i32>,
    pub segments: Vec<snapshot::Segment>,
    pub state: Option<Vec<u8>>,
    pub warm: bool,
    pub cold_reason: Option<String>,
    pub tokens_loaded: u32,
    pub digest_injected: bool,
    /// The digest version the saved KV has seen ("" if none).
    pub kv_digest_version: String,
    pub s_tokens: u32,
    pub u_tokens: u32,
    pub r_tokens: u32,
    pub load_ms: u64,
    pub stats: GenStats,
}

/// The turn's fixed blocks, tokenized once.
struct Blocks {
    base: Vec<LlamaToken>,
    hud: Vec<LlamaToken>,
    user: Vec<LlamaToken>,
    close: Vec<LlamaToken>,
}

/// Steps 1–5 of seed 000 inside a context (the save itself is the caller's).
pub fn run_in_context(
    engine: &Engine,
    ctx: &mut LlamaContext<'static>,
    job: TurnJob,
    abort: &AtomicBool,
) -> Result<TurnRun, TurnError> {
    let started = Instant::now();
    let blocks = Blocks {
        base: engine.base_tokens(&job.base_prompt),
        hud: engine.block(&engine.frame.system, &[&job.hud]),
        user: engine.block(&engine.frame.user, &[&job.user]),
        close: engine.tokenize_special(&engine.frame.reply_close, false),
    };

    // 1. Load KV: warm from the snapshot, else cold.
    let restored = job
        .snapshot
        .as_ref()
        .map(|snap| restore(engine, &mut *ctx, snap, &blocks.base));
    let (mut session, loaded) = match restored {
        Some(Ok(session)) => {
            let seen_digest = job
                .snapshot
                .as_ref()
                .map(|s| s.header.digest_version.clone())
                .unwrap_or_default();
            (
                session,
                LoadedKv {
                    warm: true,
                    cold_reason: None,
                    seen_digest,
                },
            )
        }
        Some(Err(why)) => (KvSession::empty(engine, ctx), cold(Some(why))),
        None => (KvSession::empty(engine, ctx), cold(None)),
    };
    let tokens_loaded = session.len();
    let load_ms = started.elapsed().as_millis() as u64;
    let prefill_started = Instant::now();
    if !loaded.warm {
        session.append(&blocks.base, Some(SegKind::Base))?;
        history::rebuild(
            engine,
            &mut session,
            &job.history,
            job.tail.saturating_sub(blocks.close.len() as u32),
        )?;
    }

    // 3 (decided before the prune, which must leave room for it). The digest goes in only
    // when the KV has not seen this version, or it was pruned away.
    let digest = digest_block(engine, &job, &session, &loaded);

    // 2. Prune: HUD + digest + KV + user + reply <= N_CTX, and the KV within its tail.
    let need = budget(engine, &job, &blocks, &digest)?;
    session.prune_to(job.tail.min(engine.params.n_ctx - need))?;

    // 3. Build the context: digest (when due), HUD, user message.
    if let Some(tokens) = &digest {
        session.append(tokens, Some(SegKind::Digest))?;
    }
    let hud_start = session.len();
    session.append(&blocks.hud, Some(SegKind::Turn))?;
    session.append(&blocks.user, Some(SegKind::Turn))?;
    let mut stats = GenStats {
        prefill_ms: prefill_started.elapsed().as_millis() as u64,
        ..GenStats::default()
    };

    // 4. Generate.
    let reply = session.generate(job.reply_max, abort, &mut stats)?;
    stats.ttft_ms += started.elapsed().as_millis() as u64 - stats.generate_ms;

    // 5. The HUD is ephemeral; prune to the tail; close the reply. Decoding the close
    // applies the position shift, so the exported state is already rotated.
    session.remove(hud_start, hud_start + blocks.hud.len() as u32)?;
    session.prune_to(job.tail.saturating_sub(blocks.close.len() as u32))?;
    session.append(&blocks.close, None)?;

    let state = job.export.then(|| session.export_state());
    let injected = digest.is_some();
    Ok(TurnRun {
        reply: engine.detokenize(&reply),
        token_ids: session.token_ids(),
        segments: session.segments().to_vec(),
        state,
        warm: loaded.warm,
        cold_reason: (!loaded.warm).then(|| {
            loaded
                .cold_reason
                .unwrap_or_else(|| "no snapshot".to_string())
        }),
        tokens_loaded,
        digest_injected: injected,
        kv_digest_version: if injected {
            job.digest.version.clone()
        } else {
            loaded.seen_digest
        },
        s_tokens: digest.as_ref().map_or(0, |d| d.len() as u32),
        u_tokens: engine.count_tokens(&job.user) as u32,
        r_tokens: reply.len() as u32,
        load_ms,
        stats,
    })
}

/// How step 1 went.
struct LoadedKv {
    warm: bool,
    cold_reason: Option<String>,
    /// The digest version the restored KV has seen ("" when cold).
    seen_digest: String,
}

/// Restores the snapshot when its base prompt still matches; otherwise why not. A failed
/// restore leaves the context in an unknown state: the caller's empty KV clears it.
fn restore<'e, 'c>(
    engine: &'e Engine,
    ctx: &'c mut LlamaContext<'static>,
    snap: &Snapshot,
    base: &[LlamaToken],
) -> Result<KvSession<'e, 'c>, String> {
    let prefix_ok = snap.token_ids.len() >= base.len()
        && snap.token_ids[..base.len()]
            .iter()
            .zip(base)
            .all(|(a, b)| *a == b.0);
    if !prefix_ok {
        return Err("base prompt changed".to_string());
    }
    KvSession::restore(
        engine,
        ctx,
        &snap.state,
        &snap.token_ids,
        &snap.header.segments,
    )
    .map_err(|e| e.to_string())
}

fn cold(reason: Option<String>) -> LoadedKv {
    LoadedKv {
        warm: false,
        cold_reason: reason,
        seen_digest: String::new(),
    }
}

/// The digest block to inject this turn, if one is due.
fn digest_block(
    engine: &Engine,
    job: &TurnJob,
    session: &KvSession,
    loaded: &LoadedKv,
) -> Option<Vec<LlamaToken>> {
    let has_digest = session.segments().iter().any(|s| s.kind == SegKind::Digest);
    let stale = loaded.seen_digest != job.digest.version;
    let due = if job.digest.content.is_empty() {
        // An emptied digest is injected once, so the KV stops believing the old one.
        loaded.warm && stale && !loaded.seen_digest.is_empty()
    } else {
        !loaded.warm || stale || !has_digest
    };
    due.then(|| {
        let content = if job.digest.content.is_empty() {
            "(nothing notable)"
        } else {
            &job.digest.content
        };
        engine.block(&engine.frame.system, &[&format!("World state:\n{content}")])
    })
}

/// Tokens the turn needs besides the KV; a message that cannot fit at all is fatal.
fn budget(
    engine: &Engine,
    job: &TurnJob,
    blocks: &Blocks,
    digest: &Option<Vec<LlamaToken>>,
) -> Result<u32, TurnError> {
    let digest_len = digest.as_ref().map_or(0, Vec::len);
    let need = (blocks.hud.len() + digest_len + blocks.user.len() + blocks.close.len()) as u32
        + job.reply_max;
    let n_ctx = engine.params.n_ctx;
    if blocks.base.len() as u32 + need > n_ctx {
        return Err(TurnError::fatal(format!(
            "message does not fit the context: base {} + HUD {} + digest {} + message {} + reply {} tokens > N_CTX {}",
            blocks.base.len(),
            blocks.hud.len(),
            digest_len,
            blocks.user.len(),
            job.reply_max,
            n_ctx
        )));
    }
    Ok(need)
}
