//! The engine-side half of a turn, run on an engine thread: seed 000's steps 1–5 inside one
//! llama.cpp context, from a restored or rebuilt KV to the state the save step writes.
//! Nothing here touches Postgres or files; [`super::TurnPipeline`] brings the inputs.

mod blocks;
mod job;
mod open;
mod prepared;
mod settle;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;

use crate::engine::batch::SeqJob;
use crate::engine::{self, Contexts, Engine, GenStats, KvSession, TokenSink};
use crate::snapshot::{SegKind, Segment};
use crate::turn::TurnError;

pub use blocks::CLEARED_CONTEXT;
use job::Prompt;
pub use job::{ColdSource, KvOutcome, Start, TurnJob, TurnRun};
use open::prepare;
use prepared::{Opened, Prepared};
use settle::finish;

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
    let job = &prepared.job;
    let generated =
        session.generate_into(&job.sampling, job.reply_max, abort, &mut stats, &mut reply)?;
    stats.ttft_ms += started.elapsed().as_millis() as u64 - stats.generate_ms;
    finish(engine, &mut session, prepared, generated, prompt, stats)
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

/// What a batched turn keeps of its prepared session while the batch decodes.
struct Held {
    tokens: Vec<i32>,
    segments: Vec<Segment>,
    decoded: u32,
    prepared: Box<Prepared>,
}

/// A batched turn's step 5: its sequence, decoded with the others, restored into the
/// one-sequence context with the tokens and segments it now holds, then settled as a turn
/// run alone is. `times` are when the batch started and when its shared decode did.
fn settle_batched(
    engine: &Engine,
    work: &mut LlamaContext<'static>,
    done: engine::batch::SeqDone,
    held: Held,
    pending: &[LlamaToken],
    (started, joint_at): (Instant, Instant),
) -> Result<KvOutcome, TurnError> {
    let Held {
        mut tokens,
        mut segments,
        decoded,
        prepared,
    } = held;
    let prompt = Prompt {
        prefill_tokens: decoded + pending.len() as u32,
        prompt_tokens: (tokens.len() + pending.len()) as u32,
    };
    tokens.extend(pending.iter().chain(&done.generated).map(|t| t.0));
    segments.push(Segment::new(
        SegKind::Turn,
        (pending.len() + done.generated.len()) as u32,
    ));
    let mut session = KvSession::restore(engine, work, &done.state, &tokens, &segments)?;
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
                    sampling: prepared.job.sampling.clone(),
                    abort: turn.abort,
                });
                held.push(Held {
                    tokens: session.token_ids(),
                    segments: session.segments().to_vec(),
                    decoded: session.decoded(),
                    prepared,
                });
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
    let times = (started, joint_at);
    for slot in results.iter_mut().filter(|r| r.is_none()) {
        let Some(((done, held), pending)) = ran.next() else {
            break;
        };
        *slot =
            Some(done.map_err(TurnError::from).and_then(|done| {
                settle_batched(engine, &mut ctxs.work, done, held, &pending, times)
            }));
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| Err(TurnError::retryable("the batched decode lost this turn")))
        })
        .collect()
}
