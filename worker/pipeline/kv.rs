//! The engine-side half of a turn, run on an engine thread: seed 000's steps 1–5 inside one
//! llama.cpp context, from a restored or rebuilt KV to the state the save step writes.
//! Nothing here touches Postgres or files; [`super::TurnPipeline`] brings the inputs.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;

use super::history;
use super::memory_line;
use super::recall::{ContextBlock, RecallItem};
use crate::context::digest;
use crate::engine::batch::SeqJob;
use crate::engine::{self, Contexts, Engine, GenStats, KvSession};
use crate::snapshot::{self, SegKind, Segment, Snapshot};
use crate::turn::log::Rebuild;
use crate::turn::{KvRecord, TurnError};

/// What the engine thread needs for one turn, besides where its KV comes from.
#[derive(Clone)]
pub struct TurnJob {
    /// Tags the turn's exchange segment, so the segment table says which turns the KV holds.
    pub turn_id: i64,
    pub base_prompt: String,
    pub hud: String,
    pub digest: digest::Stored,
    /// The context block; injected when the KV has not seen this version.
    pub context: ContextBlock,
    /// Recall candidates in rank order (cards first); only those the KV lacks go in.
    pub recall: Vec<RecallItem>,
    /// MEMORY_MAX_TOKENS: the recall block's whole size.
    pub recall_max: u32,
    pub user: String,
    /// The start of the reply, written by the worker (an in-chat command's answer); the
    /// model continues from it. Empty for an ordinary turn.
    pub reply_prefix: String,
    pub tail: u32,
    pub reply_max: u32,
    pub export: bool,
}

/// Where the turn's KV comes from.
pub enum Start {
    /// A trusted snapshot: resume warm.
    Snapshot(Box<Snapshot>),
    /// No trusted snapshot: rebuild the dialogue into an empty KV.
    Cold(ColdSource),
}

/// What a cold start lays back into the KV.
pub enum ColdSource {
    /// The token ids and segments the KV held after the last committed turn: the warm
    /// KV's dialogue, token for token.
    Exact(KvRecord),
    /// The recent exchanges' text, oldest first, re-tokenized (empty on a first turn).
    Text(Vec<history::Exchange>),
}

/// How the engine thread's part ended.
#[derive(Debug)]
pub enum KvOutcome {
    Ran(Box<TurnRun>),
    /// The snapshot could not be restored into this context (base prompt changed, or
    /// llama.cpp refused the state): the pipeline starts the turn again, cold.
    Refused(String),
}

/// What the engine thread produced.
#[derive(Debug)]
pub struct TurnRun {
    pub reply: String,
    /// The line the reply's hidden tail asked to keep (already cut off `reply`).
    pub memory_line: Option<String>,
    pub token_ids: Vec<i32>,
    pub segments: Vec<snapshot::Segment>,
    pub state: Option<Vec<u8>>,
    pub warm: bool,
    /// How a cold start rebuilt the dialogue; `None` when warm.
    pub rebuild: Option<Rebuild>,
    pub tokens_loaded: u32,
    pub digest_injected: bool,
    /// The digest version the saved KV has seen ("" if none).
    pub kv_digest_version: String,
    pub s_tokens: u32,
    pub u_tokens: u32,
    pub r_tokens: u32,
    /// The context block, when injected: its tokens.
    pub c_tokens: u32,
    pub context_injected: bool,
    /// The recall block, when injected: its tokens and the items it carried.
    pub m_tokens: u32,
    pub recalled: Vec<String>,
    /// Candidates left out because the KV already holds them.
    pub recall_in_kv: u32,
    pub load_ms: u64,
    /// Prompt tokens decoded before the first reply token (a cold start's lay-back, a
    /// prune's re-decode, injected blocks, a changed HUD, the message).
    pub prefill_tokens: u32,
    /// The HUD the KV ended with was the current one, so it was not decoded again.
    pub hud_kept: bool,
    pub stats: GenStats,
}

/// The turn's fixed blocks, tokenized once.
struct Blocks {
    base: Vec<LlamaToken>,
    /// The HUD segment: the HUD block, then the opening of the next user block (a role
    /// header, the same on every turn), so a warm turn whose HUD has not changed decodes
    /// only its message.
    hud: Vec<LlamaToken>,
    /// The user block: `opener` tokens, the message, the block's close.
    user: Vec<LlamaToken>,
    opener: usize,
    /// The worker-written start of the reply (empty for an ordinary turn).
    prefix: Vec<LlamaToken>,
    close: Vec<LlamaToken>,
}

/// The optional blocks a turn injects before the HUD, in the order they are trimmed when
/// the turn does not fit N_CTX: recall first, then context, then digest.
#[derive(Default)]
struct Injected {
    digest: Option<Vec<LlamaToken>>,
    /// The context block's tokens and the version its segment is tagged with.
    context: Option<(Vec<LlamaToken>, String)>,
    recall: Option<RecallBlock>,
}

impl Injected {
    fn any(&self) -> bool {
        self.digest.is_some() || self.context.is_some() || self.recall.is_some()
    }

    fn context_len(&self) -> u32 {
        self.context.as_ref().map_or(0, |(c, _)| c.len() as u32)
    }
}

/// A recall block's tokens and the item keys it carries.
type RecallBlock = (Vec<LlamaToken>, Vec<String>);

/// Steps 1–5 of seed 000 inside a context (the save itself is the caller's).
pub fn run_in_context(
    engine: &Engine,
    ctx: &mut LlamaContext<'static>,
    job: TurnJob,
    start: Start,
    abort: &AtomicBool,
) -> Result<KvOutcome, TurnError> {
    let started = Instant::now();
    let (mut session, prepared) = match prepare(engine, ctx, job, start)? {
        Opened::Ready(session, prepared) => (session, *prepared),
        Opened::Refused(why) => return Ok(KvOutcome::Refused(why)),
    };
    session.append(prepared.message(), Some(SegKind::Turn))?;
    session.append(&prepared.blocks.prefix, None)?;
    let mut stats = GenStats {
        prefill_ms: prepared.prefill_started.elapsed().as_millis() as u64,
        ..GenStats::default()
    };
    let prefill_tokens = session.decoded();

    // 4. Generate, after the worker-written start of the reply when there is one.
    let generated = session.generate(prepared.job.reply_max, abort, &mut stats)?;
    stats.ttft_ms += started.elapsed().as_millis() as u64 - stats.generate_ms;
    finish(
        engine,
        &mut session,
        prepared,
        generated,
        prefill_tokens,
        stats,
    )
}

/// One turn of [`run_batch`].
pub struct BatchTurn {
    pub job: TurnJob,
    pub start: Start,
    pub abort: Arc<AtomicBool>,
}

impl BatchTurn {
    /// A turn nothing aborts (benchmarks, tests and replays of a batch).
    pub fn new(job: TurnJob, start: Start) -> BatchTurn {
        BatchTurn {
            job,
            start,
            abort: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// Several sessions' turns on one engine thread, their messages and replies decoded
/// together ([`engine::batch`]). Each turn is prepared (steps 1–3 but the message) in the
/// one-sequence context and handed over as its exported KV; after the shared decode its
/// sequence is exported and restored into the one-sequence context for step 5, so the
/// saved KV is what a turn run alone saves. Results come back in the order of `turns`.
pub fn run_batch(
    engine: &Engine,
    ctxs: &mut Contexts,
    turns: Vec<BatchTurn>,
) -> Vec<Result<KvOutcome, TurnError>> {
    let started = Instant::now();
    let Some(batch_ctx) = ctxs.batch.as_mut().filter(|_| turns.len() > 1) else {
        // Alone, a turn runs as it would with batching off.
        return turns
            .into_iter()
            .map(|t| run_in_context(engine, &mut ctxs.work, t.job, t.start, &t.abort))
            .collect();
    };
    let mut results: Vec<Option<Result<KvOutcome, TurnError>>> = Vec::new();
    let mut held = Vec::new();
    let mut seqs = Vec::new();
    for turn in turns {
        let prepared = match prepare(engine, &mut ctxs.work, turn.job, turn.start) {
            Ok(Opened::Ready(session, prepared)) => {
                let message = prepared.message();
                seqs.push(SeqJob {
                    state: session.export_state(),
                    held: session.len(),
                    pending: [message, &prepared.blocks.prefix[..]].concat(),
                    max: prepared.job.reply_max,
                    abort: turn.abort,
                });
                held.push((
                    session.token_ids(),
                    session.segments().to_vec(),
                    session.decoded(),
                    prepared,
                ));
                None
            }
            Ok(Opened::Refused(why)) => Some(Ok(KvOutcome::Refused(why))),
            Err(e) => Some(Err(e)),
        };
        results.push(prepared);
    }
    let pending: Vec<Vec<LlamaToken>> = seqs.iter().map(|s| s.pending.clone()).collect();
    let joint_at = Instant::now();
    let decoded = engine::batch::decode_together(engine, batch_ctx, seqs);
    let mut ran = decoded.into_iter().zip(held).zip(pending);
    for slot in results.iter_mut().filter(|r| r.is_none()) {
        let Some(((done, (tokens, segments, decoded, prepared)), pending)) = ran.next() else {
            break;
        };
        *slot = Some(done.map_err(TurnError::from).and_then(|done| {
            let prefill_tokens = decoded + pending.len() as u32;
            let mut tokens = tokens;
            tokens.extend(pending.iter().chain(&done.generated).map(|t| t.0));
            let mut segments = segments;
            segments.push(Segment::new(
                SegKind::Turn,
                (pending.len() + done.generated.len()) as u32,
            ));
            let mut session =
                KvSession::restore(engine, &mut ctxs.work, &done.state, &tokens, &segments)?;
            let ms = |from: Instant| joint_at.duration_since(from).as_millis() as u64;
            let stats = GenStats {
                prefill_ms: ms(prepared.prefill_started) + done.first_token_ms,
                ttft_ms: ms(started) + done.first_token_ms,
                generate_ms: done.done_ms - done.first_token_ms,
                redecode_ms: 0,
            };
            finish(
                engine,
                &mut session,
                *prepared,
                done.generated,
                prefill_tokens,
                stats,
            )
        }));
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| Err(TurnError::retryable("the batched decode lost this turn")))
        })
        .collect()
}

/// How a turn's KV came up.
enum Opened<'e, 'c> {
    Ready(KvSession<'e, 'c>, Box<Prepared>),
    /// The snapshot could not be restored: why.
    Refused(String),
}

/// A turn after steps 1–3, up to its message.
struct Prepared {
    job: TurnJob,
    blocks: Blocks,
    loaded: LoadedKv,
    injected: Injected,
    tokens_loaded: u32,
    load_ms: u64,
    prefill_started: Instant,
    hud_kept: bool,
    /// Where the HUD segment starts, for step 5.
    hud_start: u32,
    recall_in_kv: u32,
}

impl Prepared {
    /// The tokens that open the exchange (a new turn segment): the whole user block after
    /// injected blocks, else the message after the HUD segment's opening.
    fn message(&self) -> &[LlamaToken] {
        if self.injected.any() {
            &self.blocks.user
        } else {
            &self.blocks.user[self.blocks.opener..]
        }
    }
}

/// Steps 1–3 in a one-sequence context, all but the message: the KV restored or rebuilt,
/// pruned, and given the HUD and the blocks due.
fn prepare<'e, 'c>(
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
            Err(why) => return Ok(Opened::Refused(why)),
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

    // 3. Build the context: the HUD (unless the KV ends with it), digest, context and
    // recall (when due); the message is the caller's.
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

/// Step 5's engine half after the reply: the hidden memory line comes off, the exchange
/// settles into the KV, and the state is exported for the save.
fn finish(
    engine: &Engine,
    session: &mut KvSession,
    prepared: Prepared,
    generated: Vec<LlamaToken>,
    prefill_tokens: u32,
    mut stats: GenStats,
) -> Result<KvOutcome, TurnError> {
    let Prepared {
        job,
        blocks,
        loaded,
        injected,
        tokens_loaded,
        load_ms,
        hud_kept,
        hud_start,
        recall_in_kv,
        ..
    } = prepared;
    let reply = [&blocks.prefix[..], &generated[..]].concat();
    // A hidden memory-line tail leaves the reply, and the KV keeps the reply as stored.
    let hidden = memory_line::split(&engine.detokenize(&reply));
    let stored = if hidden.stripped {
        engine.tokenize_plain(&hidden.reply)
    } else {
        reply.clone()
    };

    // 5. The exchange stays, within the tail, and the current HUD goes back to the end.
    let redecode_started = Instant::now();
    settle(session, hud_start, &blocks, &stored, job.tail, job.turn_id)?;
    stats.redecode_ms = redecode_started.elapsed().as_millis() as u64;

    let state = job.export.then(|| session.export_state());
    let c_tokens = injected.context_len();
    let digest = injected.digest;
    let digest_injected = digest.is_some();
    Ok(KvOutcome::Ran(Box::new(TurnRun {
        reply: hidden.reply,
        memory_line: hidden.line,
        token_ids: session.token_ids(),
        segments: session.segments().to_vec(),
        state,
        warm: loaded.rebuild.is_none(),
        rebuild: loaded.rebuild,
        tokens_loaded,
        digest_injected,
        kv_digest_version: if digest_injected {
            job.digest.version.clone()
        } else {
            loaded.seen_digest.unwrap_or_default()
        },
        s_tokens: digest.as_ref().map_or(0, |d| d.len() as u32),
        u_tokens: engine.count_tokens(&job.user) as u32,
        r_tokens: reply.len() as u32,
        c_tokens,
        context_injected: injected.context.is_some(),
        m_tokens: injected.recall.as_ref().map_or(0, |(t, _)| t.len() as u32),
        recalled: injected.recall.map(|(_, keys)| keys).unwrap_or_default(),
        recall_in_kv,
        load_ms,
        prefill_tokens,
        hud_kept,
        stats,
    })))
}

impl Blocks {
    fn new(engine: &Engine, job: &TurnJob) -> Blocks {
        // `block` tokenizes the frame's parts apart from the content, so the user block
        // always starts with exactly these tokens.
        let opener = engine.tokenize_special(&engine.frame.user.parts[0], false);
        Blocks {
            base: engine.base_tokens(&job.base_prompt),
            hud: [
                engine.block(&engine.frame.system, &[&job.hud]),
                opener.clone(),
            ]
            .concat(),
            user: engine.block(&engine.frame.user, &[&job.user]),
            opener: opener.len(),
            prefix: if job.reply_prefix.is_empty() {
                Vec::new()
            } else {
                engine.tokenize_plain(&job.reply_prefix)
            },
            close: engine.tokenize_special(&engine.frame.reply_close, false),
        }
    }
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

/// Step 5's KV half. Everything from the HUD on leaves the KV and is decoded again
/// without the HUD in front of the message: the blocks injected this turn, the exchange
/// (message, reply, close) as one segment, then the HUD segment (the current HUD and the
/// next user block's opening) as the last segment, where the next turn finds it. A prune
/// comes first when the tail needs one. The saved KV is then exactly what a cold start
/// decodes from the same tokens ([`history::decode_exact`]), and it never holds more than
/// one HUD. `reply` is the reply as stored (without a memory-line tail), so the KV never
/// holds the tail.
fn settle(
    session: &mut KvSession,
    hud_start: u32,
    blocks: &Blocks,
    reply: &[LlamaToken],
    tail: u32,
    turn_id: i64,
) -> Result<(), TurnError> {
    // The segments after the HUD: this turn's injected blocks, then the exchange so far.
    let mut injected = Vec::new();
    let mut at = 0usize;
    for seg in session.segments() {
        let span = at..at + seg.len as usize;
        at = span.end;
        if span.start > hud_start as usize {
            injected.push((seg.clone(), session.tokens()[span].to_vec()));
        }
    }
    injected.pop();
    let exchange = [&blocks.user[..], reply, &blocks.close[..]].concat();
    session.truncate_tail(hud_start)?;
    let room = (injected.iter().map(|(_, t)| t.len()).sum::<usize>()
        + exchange.len()
        + blocks.hud.len()) as u32;
    if session.len() + room > tail {
        session.prune_to(low_water(tail).saturating_sub(room))?;
    }
    for (seg, tokens) in &injected {
        session.append_segment(tokens, seg.kind, &seg.tag)?;
    }
    session.append_segment(&exchange, SegKind::Turn, &turn_id.to_string())?;
    session.append(&blocks.hud, Some(SegKind::Hud))?;
    // Only an exchange longer than the tail itself still overflows: it goes too.
    session.prune_to(tail)?;
    Ok(())
}

/// Where a prune at the end of a turn takes the KV: below the tail, so the re-decode a
/// prune costs comes once every few turns instead of on every turn at the plateau.
fn low_water(tail: u32) -> u32 {
    tail - tail / 4
}

/// How step 1 went.
struct LoadedKv {
    /// `None` when warm.
    rebuild: Option<Rebuild>,
    /// The digest version the KV has seen, when its dialogue is known exactly (warm, or
    /// rebuilt from the record); `None` after a text rebuild, which holds no digest.
    seen_digest: Option<String>,
}

/// Restores the snapshot when its base prompt still matches; otherwise why not. A failed
/// restore leaves the context in an unknown state: the cold retry's empty KV clears it.
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

/// The digest block to inject this turn, if one is due.
fn digest_block(
    engine: &Engine,
    job: &TurnJob,
    session: &KvSession,
    loaded: &LoadedKv,
) -> Option<Vec<LlamaToken>> {
    let has_digest = session.segments().iter().any(|s| s.kind == SegKind::Digest);
    let due = match &loaded.seen_digest {
        // An emptied digest is injected once, so the KV stops believing the old one.
        Some(seen) if job.digest.content.is_empty() => {
            *seen != job.digest.version && !seen.is_empty()
        }
        Some(seen) => *seen != job.digest.version || !has_digest,
        None => !job.digest.content.is_empty(),
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

/// The context block to inject this turn, if the KV does not hold its version.
fn context_block(
    engine: &Engine,
    job: &TurnJob,
    session: &KvSession,
) -> Option<(Vec<LlamaToken>, String)> {
    let newest = session
        .segments()
        .iter()
        .rev()
        .find(|s| s.kind == SegKind::Context);
    if job.context.content.is_empty() {
        // What the KV holds is no longer supported by the stored parts (a todo was closed,
        // a summary withdrawn): an explicit empty block supersedes it, as a newer block
        // supersedes an older one, instead of leaving it standing.
        let stale = newest.is_some_and(|s| s.tag != CLEARED_CONTEXT);
        return stale.then(|| {
            let text = "What you remember now: nothing to note.";
            (
                engine.block(&engine.frame.system, &[text]),
                CLEARED_CONTEXT.to_string(),
            )
        });
    }
    let seen = newest.is_some_and(|s| s.tag == job.context.version);
    (!seen).then(|| {
        let text = format!("What you remember:\n{}", job.context.content);
        (
            engine.block(&engine.frame.system, &[&text]),
            job.context.version.clone(),
        )
    })
}

/// The tag of the block that clears a context the stored parts no longer support.
pub const CLEARED_CONTEXT: &str = "cleared";

/// The recall block: the candidates the KV does not hold, in rank order, as many as fit
/// `recall_max` tokens; and how many candidates the KV already held.
fn recall_block(engine: &Engine, job: &TurnJob, session: &KvSession) -> (Option<RecallBlock>, u32) {
    let held: std::collections::HashSet<&str> =
        session.segments().iter().flat_map(|s| s.items()).collect();
    let mut in_kv = 0;
    let mut lines: Vec<&str> = Vec::new();
    let mut keys: Vec<String> = Vec::new();
    let mut tokens: Option<Vec<LlamaToken>> = None;
    for item in &job.recall {
        if held.contains(item.key.as_str()) {
            in_kv += 1;
            continue;
        }
        lines.push(&item.text);
        let block = recall_text(engine, &lines);
        if block.len() as u32 > job.recall_max {
            lines.pop();
            continue;
        }
        keys.push(item.key.clone());
        tokens = Some(block);
    }
    (tokens.map(|t| (t, keys)), in_kv)
}

/// Seed 001's relevant-memories block (cards come first in `lines`).
fn recall_text(engine: &Engine, lines: &[&str]) -> Vec<LlamaToken> {
    let body: Vec<String> = lines.iter().map(|l| format!("- {l}")).collect();
    engine.block(
        &engine.frame.system,
        &[&format!("Relevant memories:\n{}", body.join("\n"))],
    )
}

/// Tokens the turn needs besides the KV. When even an empty KV leaves too little room, the
/// optional blocks are trimmed in order (recall, then context, then digest); a message that
/// cannot fit without them is fatal. Returns the tokens needed and the room kept for recall
/// (0 when recall was trimmed).
fn budget(
    engine: &Engine,
    job: &TurnJob,
    blocks: &Blocks,
    hud_in_kv: bool,
    injected: &mut Injected,
    recall_room: u32,
) -> Result<(u32, u32), TurnError> {
    let n_ctx = engine.params.n_ctx;
    // The HUD segment ends with the user block's opening.
    let hud = if hud_in_kv { 0 } else { blocks.hud.len() };
    let message = blocks.user.len() - blocks.opener;
    let fixed = (hud + message + blocks.prefix.len() + blocks.close.len()) as u32 + job.reply_max;
    let len = |b: &Option<Vec<LlamaToken>>| b.as_ref().map_or(0, Vec::len) as u32;
    // The base prompt and a kept HUD are in the KV, but no prune can take them out.
    let base = (blocks.base.len() + blocks.hud.len() - hud) as u32;
    let mut recall = recall_room;
    let total =
        |i: &Injected, recall: u32| base + fixed + len(&i.digest) + i.context_len() + recall;
    if total(injected, recall) > n_ctx {
        recall = 0;
    }
    if total(injected, recall) > n_ctx {
        injected.context = None;
    }
    if total(injected, recall) > n_ctx {
        injected.digest = None;
    }
    if total(injected, recall) > n_ctx {
        return Err(TurnError::fatal(format!(
            "message does not fit the context: base {} + HUD {} + message {} + reply {} tokens > N_CTX {}",
            blocks.base.len(),
            blocks.hud.len() - blocks.opener,
            blocks.user.len() + blocks.prefix.len(),
            job.reply_max,
            n_ctx
        )));
    }
    Ok((
        fixed + len(&injected.digest) + injected.context_len() + recall,
        recall,
    ))
}
