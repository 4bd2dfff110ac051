//! The engine-side half of a turn, run on an engine thread: seed 000's steps 1–5 inside one
//! llama.cpp context, from a restored or rebuilt KV to the state the save step writes.
//! Nothing here touches Postgres or files; [`super::TurnPipeline`] brings the inputs.

mod blocks;
mod open;
mod settle;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;

use super::history;
use super::recall::{ContextBlock, RecallItem};
use super::reply_stream::ReplyStream;
use crate::context::digest;
use crate::engine::batch::SeqJob;
use crate::engine::{self, Contexts, Engine, GenStats, KvSession, TokenSink};
use crate::snapshot::{self, SegKind, Segment, Snapshot};
use crate::stream;
use crate::turn::log::Rebuild;
use crate::turn::{KvRecord, TurnError};

use blocks::Blocks;
use blocks::Injected;
pub use blocks::CLEARED_CONTEXT;
use open::prepare;
use settle::finish;

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
    /// Where the reply streams while it is generated; `None`: it is not streamed.
    pub stream: Option<stream::Target>,
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
    /// The whole prompt the reply was conditioned on: what the KV held when generation
    /// started, restored or decoded.
    pub prompt_tokens: u32,
    /// The HUD the KV ended with was the current one, so it was not decoded again.
    pub hud_kept: bool,
    pub stats: GenStats,
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
    /// The reply's stream, opened with what the turn knows as it starts generating: the
    /// first delta's `meta`, which the HTTP relay's first chunk carries.
    fn open_stream(&self, engine: &Engine, prompt: Prompt) -> ReplyStream {
        let mut reply = ReplyStream::new(
            self.job.stream.as_ref().map(stream::Target::open),
            &self.blocks.prefix,
        );
        reply.start(
            engine,
            serde_json::json!({
                "cold": self.loaded.rebuild.is_some(),
                "digest_injected": self.injected.digest.is_some(),
                "digest_version": self.job.digest.version,
                "prompt_tokens": prompt.prompt_tokens,
                "cached_tokens": prompt.prompt_tokens.saturating_sub(prompt.prefill_tokens),
            }),
        );
        reply
    }

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

/// How step 1 went.
struct LoadedKv {
    /// `None` when warm.
    rebuild: Option<Rebuild>,
    /// The digest version the KV has seen, when its dialogue is known exactly (warm, or
    /// rebuilt from the record); `None` after a text rebuild, which holds no digest.
    seen_digest: Option<String>,
}

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
    let prompt = Prompt {
        prefill_tokens: session.decoded(),
        prompt_tokens: session.len(),
    };

    // 4. Generate, after the worker-written start of the reply when there is one, each
    // token streamed as it comes.
    let mut reply = prepared.open_stream(engine, prompt);
    let generated = session.generate_into(prepared.job.reply_max, abort, &mut stats, &mut reply)?;
    stats.ttft_ms += started.elapsed().as_millis() as u64 - stats.generate_ms;
    finish(engine, &mut session, prepared, generated, prompt, stats)
}

/// The prompt a reply was conditioned on: what the KV held when generation started, and
/// how much of it this turn decoded.
#[derive(Debug, Clone, Copy)]
struct Prompt {
    prefill_tokens: u32,
    prompt_tokens: u32,
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
// Long: the prepares, the shared decode and each turn's step 5, in the order they run.
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
    let mut streams = Vec::new();
    for turn in turns {
        let prepared = match prepare(engine, &mut ctxs.work, turn.job, turn.start) {
            Ok(Opened::Ready(session, prepared)) => {
                let pending = [prepared.message(), &prepared.blocks.prefix[..]].concat();
                let prompt = Prompt {
                    prefill_tokens: session.decoded() + pending.len() as u32,
                    prompt_tokens: session.len() + pending.len() as u32,
                };
                streams.push(prepared.open_stream(engine, prompt));
                seqs.push(SeqJob {
                    state: session.export_state(),
                    held: session.len(),
                    pending,
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
    let mut sinks: Vec<&mut dyn TokenSink> = streams
        .iter_mut()
        .map(|r| r as &mut dyn TokenSink)
        .collect();
    let decoded = engine::batch::decode_together_into(engine, batch_ctx, seqs, &mut sinks);
    // An aborted turn's stream tells the publisher now, not after every turn's step 5.
    drop(sinks);
    drop(streams);
    let mut ran = decoded.into_iter().zip(held).zip(pending);
    for slot in results.iter_mut().filter(|r| r.is_none()) {
        let Some(((done, (tokens, segments, decoded, prepared)), pending)) = ran.next() else {
            break;
        };
        *slot = Some(done.map_err(TurnError::from).and_then(|done| {
            let prompt = Prompt {
                prefill_tokens: decoded + pending.len() as u32,
                prompt_tokens: (tokens.len() + pending.len()) as u32,
            };
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
                prompt,
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
