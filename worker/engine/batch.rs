//! Several sessions decoded together in one multi-sequence context: on a CPU a generation
//! step reads every weight once whether it carries one token or eight, so sessions that
//! generate at the same time share those reads instead of taking turns.
//!
//! Each session arrives as the state of its KV (exported from a one-sequence context) and
//! the prompt tokens still to decode. It is restored into its own sequence of a context with
//! a unified KV (a one-sequence state restores into any sequence only then), its pending
//! tokens are decoded in shared prefill chunks, and its reply is generated in shared steps,
//! one token per session per step. Each session's KV is then exported from its own
//! sequence, in the same format a one-sequence context restores.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::session::LlamaStateSeqFlags;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

use super::error::{EngineError, Result};
use super::model::{export_seq, Engine, TokenSink};
use super::sampling::Sampling;

/// One session's part of a joint decode.
pub struct SeqJob {
    /// The session's KV before `pending`, as `state_seq_get_data_ext` wrote it.
    pub state: Vec<u8>,
    /// Positions `state` holds.
    pub held: u32,
    /// Prompt tokens to decode before the reply (at least one: the reply's logits come from
    /// the last of them).
    pub pending: Vec<LlamaToken>,
    /// Most reply tokens.
    pub max: u32,
    /// The reply's own sampling and stop strings.
    pub sampling: Sampling,
    pub abort: Arc<AtomicBool>,
}

/// What a joint decode produced for one session.
#[derive(Debug)]
pub struct SeqDone {
    pub generated: Vec<LlamaToken>,
    /// The sequence's KV after the reply: `held + pending + generated` positions.
    pub state: Vec<u8>,
    /// From the start of the joint decode: to the first reply token, and to the last.
    pub first_token_ms: u64,
    pub done_ms: u64,
}

/// A session's progress through the joint decode.
struct Live {
    seq: i32,
    sampler: LlamaSampler,
    /// The sampled token not yet decoded.
    next: Option<LlamaToken>,
    out: Vec<LlamaToken>,
    /// Position of the next token decoded.
    pos: u32,
    first_token_ms: u64,
    done_ms: u64,
    result: Option<Result<()>>,
}

/// Decodes every job's pending tokens and generates its reply, together. `ctx` needs at
/// least `jobs.len()` sequences and a unified KV ([`Engine::new_batch_context`]). Results
/// come back in the order of `jobs`; one session's refused restore or abort does not stop
/// the others, while a failed shared decode fails every session still running.
pub fn decode_together(
    engine: &Engine,
    ctx: &mut LlamaContext<'static>,
    jobs: Vec<SeqJob>,
) -> Vec<Result<SeqDone>> {
    let mut none = vec![(); jobs.len()];
    let mut sinks: Vec<&mut dyn TokenSink> =
        none.iter_mut().map(|n| n as &mut dyn TokenSink).collect();
    decode_together_into(engine, ctx, jobs, &mut sinks)
}

/// [`decode_together`], handing each session's tokens to its sink (`sinks[i]` for
/// `jobs[i]`) as soon as they are sampled.
pub fn decode_together_into(
    engine: &Engine,
    ctx: &mut LlamaContext<'static>,
    jobs: Vec<SeqJob>,
    sinks: &mut [&mut dyn TokenSink],
) -> Vec<Result<SeqDone>> {
    let started = Instant::now();
    let ms = || started.elapsed().as_millis() as u64;
    ctx.clear_kv_cache();
    let mut live: Vec<Live> = Vec::with_capacity(jobs.len());
    for (i, job) in jobs.iter().enumerate() {
        let seq = i as i32;
        // SAFETY: the bytes came from state_seq_get_data_ext of a context of the same model,
        // KV type and build moments ago; llama.cpp checks sizes and returns false on any
        // mismatch.
        let ok =
            unsafe { ctx.state_seq_set_data_ext(&job.state, seq, LlamaStateSeqFlags::empty()) };
        let restored = ok && ctx.kv_cache_seq_pos_max(seq) + 1 == job.held as i32;
        let result = if !restored {
            Some(Err(EngineError::RestoreRefused))
        } else if job.pending.is_empty() {
            Some(Err(EngineError::Decode(
                "nothing to decode before the reply".into(),
            )))
        } else {
            None
        };
        if result.is_some() {
            let _ = ctx.kv_cache_seq_rm(seq, None, None);
        }
        live.push(Live {
            seq,
            sampler: engine.sampler(&job.sampling),
            next: None,
            out: Vec::new(),
            pos: job.held,
            first_token_ms: 0,
            done_ms: 0,
            result,
        });
    }

    let mut joint = Joint {
        engine,
        ctx: &mut *ctx,
        jobs: &jobs,
        live: &mut live,
        sinks,
        ms: &ms,
    };
    if let Err(e) = joint.prefill() {
        fail_running(joint.live, &e);
    }
    if let Err(e) = joint.generate() {
        fail_running(joint.live, &e);
    }

    live.into_iter()
        .map(|l| {
            l.result.unwrap_or(Ok(()))?;
            Ok(SeqDone {
                state: export_seq(ctx, l.seq),
                generated: l.out,
                first_token_ms: l.first_token_ms,
                done_ms: l.done_ms,
            })
        })
        .collect()
}

fn fail_running(live: &mut [Live], e: &EngineError) {
    for l in live.iter_mut().filter(|l| l.result.is_none()) {
        l.result = Some(Err(EngineError::Decode(e.to_string())));
    }
}

/// What the two phases of a joint decode, shared prefill and shared generation steps,
/// both read and advance.
struct Joint<'a, 's> {
    engine: &'a Engine,
    ctx: &'a mut LlamaContext<'static>,
    jobs: &'a [SeqJob],
    live: &'a mut [Live],
    sinks: &'a mut [&'s mut dyn TokenSink],
    /// Milliseconds since the joint decode started.
    ms: &'a dyn Fn() -> u64,
}

impl Joint<'_, '_> {
    /// The pending tokens of every running session, in chunks of at most `n_batch` tokens; a
    /// session's first reply token is sampled right after the chunk holding its last pending
    /// token, before the next chunk overwrites the logits.
    fn prefill(&mut self) -> Result<()> {
        let jobs = self.jobs;
        let n_batch = self.engine.params.n_batch as usize;
        let mut batch = LlamaBatch::new(n_batch, self.live.len() as i32);
        // (session, index in the batch) of the logits rows this chunk produces.
        let mut rows: Vec<(usize, i32)> = Vec::new();
        let all = self
            .live
            .iter()
            .enumerate()
            .filter(|(_, l)| l.result.is_none())
            .flat_map(|(i, _)| {
                let n = jobs[i].pending.len();
                jobs[i]
                    .pending
                    .iter()
                    .enumerate()
                    .map(move |(k, &t)| (i, k, t, k + 1 == n))
            })
            .collect::<Vec<_>>();
        for chunk in all.chunks(n_batch) {
            batch.clear();
            rows.clear();
            for &(i, k, t, last) in chunk {
                let pos = (self.live[i].pos as usize + k) as i32;
                if last {
                    rows.push((i, batch.n_tokens()));
                }
                batch
                    .add(t, pos, &[self.live[i].seq], last)
                    .map_err(|e| EngineError::Decode(e.to_string()))?;
            }
            self.ctx
                .decode(&mut batch)
                .map_err(|e| EngineError::Decode(e.to_string()))?;
            for &(i, row) in &rows {
                let l = &mut self.live[i];
                l.pos += jobs[i].pending.len() as u32;
                l.next = Some(l.sampler.sample(self.ctx, row));
                l.first_token_ms = (self.ms)();
            }
        }
        Ok(())
    }

    /// Shared generation steps: each running session adds its sampled token to the step's
    /// batch until it samples an end-of-generation token, reaches its `max`, holds a stop
    /// string, or is aborted. The rule per session is the one-sequence loop's
    /// ([`super::KvSession::generate`]), so a session's reply does not depend on who shares
    /// the steps.
    fn generate(&mut self) -> Result<()> {
        let jobs = self.jobs;
        let mut batch = LlamaBatch::new(self.live.len().max(1), self.live.len() as i32);
        let mut rows: Vec<(usize, i32)> = Vec::new();
        loop {
            batch.clear();
            rows.clear();
            for (i, l) in self.live.iter_mut().enumerate() {
                if l.result.is_some() {
                    continue;
                }
                if jobs[i].abort.load(Ordering::Relaxed) {
                    l.result = Some(Err(EngineError::Aborted));
                    continue;
                }
                let next = match l.next {
                    Some(t)
                        if (l.out.len() as u32) < jobs[i].max
                            && !self.engine.is_eog(t)
                            && !self.engine.stops(&jobs[i].sampling, &l.out) =>
                    {
                        t
                    }
                    _ => {
                        l.done_ms = (self.ms)();
                        l.result = Some(Ok(()));
                        self.sinks[i].finished(self.engine, &l.out);
                        continue;
                    }
                };
                l.out.push(next);
                self.sinks[i].token(self.engine, next);
                rows.push((i, batch.n_tokens()));
                batch
                    .add(next, l.pos as i32, &[l.seq], true)
                    .map_err(|e| EngineError::Decode(e.to_string()))?;
                l.pos += 1;
            }
            if rows.is_empty() {
                return Ok(());
            }
            self.ctx
                .decode(&mut batch)
                .map_err(|e| EngineError::Decode(e.to_string()))?;
            for &(i, row) in &rows {
                let l = &mut self.live[i];
                l.next = Some(l.sampler.sample(self.ctx, row));
            }
        }
    }
}
