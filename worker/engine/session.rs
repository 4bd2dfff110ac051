//! One session's live KV inside a context. The token ids and segments mirror the KV
//! exactly, so pruning, ephemeral spans and snapshots never guess at what it holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use llama_cpp_2::context::session::LlamaStateSeqFlags;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use super::error::{EngineError, Result};
use super::model::{Engine, TokenSink, SEQ};
use super::sampling::Sampling;
use crate::snapshot::{SegKind, Segment};

/// Timings of one generation, in milliseconds.
#[derive(Debug, Default, Clone, Copy)]
pub struct GenStats {
    pub prefill_ms: u64,
    pub ttft_ms: u64,
    pub generate_ms: u64,
    /// Decoding the exchange again without the HUD, and after a prune.
    pub redecode_ms: u64,
}

/// The live KV of one session inside a context: token ids and segments mirror it exactly.
pub struct KvSession<'e, 'c> {
    engine: &'e Engine,
    ctx: &'c mut LlamaContext<'static>,
    tokens: Vec<LlamaToken>,
    segments: Vec<Segment>,
    /// Tokens decoded through this session so far (prompt side only, not generated ones):
    /// what a turn's `prefill_tokens` reports.
    decoded: u32,
}

impl<'e, 'c> KvSession<'e, 'c> {
    /// An empty KV.
    pub fn empty(engine: &'e Engine, ctx: &'c mut LlamaContext<'static>) -> KvSession<'e, 'c> {
        ctx.clear_kv_cache();
        KvSession {
            engine,
            ctx,
            tokens: Vec::new(),
            segments: Vec::new(),
            decoded: 0,
        }
    }

    /// Restores a saved state. The caller has already verified the snapshot's header.
    pub fn restore(
        engine: &'e Engine,
        ctx: &'c mut LlamaContext<'static>,
        state: &[u8],
        token_ids: &[i32],
        segments: &[Segment],
    ) -> Result<KvSession<'e, 'c>> {
        ctx.clear_kv_cache();
        // SAFETY: the bytes passed the snapshot CRC and came from state_seq_get_data_ext of
        // the same model, KV type and llama.cpp build; llama.cpp checks sizes and returns 0
        // on any mismatch, which we treat as a cold start.
        let ok = unsafe { ctx.state_seq_set_data_ext(state, SEQ, LlamaStateSeqFlags::empty()) };
        let positions = ctx.kv_cache_seq_pos_max(SEQ) + 1;
        if !ok || positions != token_ids.len() as i32 {
            ctx.clear_kv_cache();
            return Err(EngineError::RestoreRefused);
        }
        Ok(KvSession {
            engine,
            ctx,
            tokens: token_ids.iter().map(|&t| LlamaToken(t)).collect(),
            segments: segments.to_vec(),
            decoded: 0,
        })
    }

    pub fn len(&self) -> u32 {
        self.tokens.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn token_ids(&self) -> Vec<i32> {
        self.tokens.iter().map(|t| t.0).collect()
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    pub fn tokens(&self) -> &[LlamaToken] {
        &self.tokens
    }

    /// Prompt tokens decoded through this session so far.
    pub fn decoded(&self) -> u32 {
        self.decoded
    }

    /// The HUD the KV ends with, if it ends with one.
    pub fn trailing_hud(&self) -> Option<&[LlamaToken]> {
        let last = self.segments.last().filter(|s| s.kind == SegKind::Hud)?;
        Some(&self.tokens[self.tokens.len() - last.len as usize..])
    }

    /// Removes every HUD segment (a KV holds at most one, at its end, where removing it
    /// costs nothing; one found elsewhere is dropped like a pruned segment).
    pub fn drop_hud(&mut self) -> Result<()> {
        let doomed: Vec<bool> = self
            .segments
            .iter()
            .map(|s| s.kind == SegKind::Hud)
            .collect();
        self.drop_segments(&doomed).map(|_| ())
    }

    /// Decodes `tokens` after the current tail, as one new segment (or extending the last
    /// segment when `kind` is `None`). Logits are kept for the final token only.
    pub fn append(&mut self, tokens: &[LlamaToken], kind: Option<SegKind>) -> Result<()> {
        self.decode(tokens)?;
        match (kind, self.segments.last_mut()) {
            (None, Some(last)) => last.len += tokens.len() as u32,
            (kind, _) => self.segments.push(Segment::new(
                kind.unwrap_or(SegKind::Turn),
                tokens.len() as u32,
            )),
        }
        Ok(())
    }

    /// Decodes `tokens` as one new segment that records what it carries (`tag`).
    pub fn append_segment(
        &mut self,
        tokens: &[LlamaToken],
        kind: SegKind,
        tag: &str,
    ) -> Result<()> {
        self.decode(tokens)?;
        self.segments
            .push(Segment::tagged(kind, tokens.len() as u32, tag));
        Ok(())
    }

    fn decode(&mut self, tokens: &[LlamaToken]) -> Result<()> {
        if tokens.is_empty() {
            return Ok(());
        }
        let n_batch = self.engine.params.n_batch as usize;
        let mut batch = LlamaBatch::new(n_batch, 1);
        let start = self.tokens.len();
        for (c, chunk) in tokens.chunks(n_batch).enumerate() {
            batch.clear();
            let last_chunk = (c + 1) * n_batch >= tokens.len();
            for (i, &t) in chunk.iter().enumerate() {
                let pos = (start + c * n_batch + i) as i32;
                let logits = last_chunk && i + 1 == chunk.len();
                batch
                    .add(t, pos, &[SEQ], logits)
                    .map_err(|e| EngineError::Decode(e.to_string()))?;
            }
            self.ctx
                .decode(&mut batch)
                .map_err(|e| EngineError::Decode(e.to_string()))?;
        }
        self.tokens.extend_from_slice(tokens);
        self.decoded += tokens.len() as u32;
        Ok(())
    }

    /// Greedy (or configured) generation of at most `max` tokens, stopping at end of turn.
    /// The prompt must have just been appended, so its last logits are current.
    pub fn generate(
        &mut self,
        max: u32,
        abort: &AtomicBool,
        stats: &mut GenStats,
    ) -> Result<Vec<LlamaToken>> {
        self.generate_into(&Sampling::default(), max, abort, stats, &mut ())
    }

    /// [`KvSession::generate`] with the reply's own sampling (which may end it at a stop
    /// string), handing each token to `sink` as soon as it is sampled.
    pub fn generate_into(
        &mut self,
        own: &Sampling,
        max: u32,
        abort: &AtomicBool,
        stats: &mut GenStats,
        sink: &mut dyn TokenSink,
    ) -> Result<Vec<LlamaToken>> {
        let started = Instant::now();
        let mut sampler = self.engine.sampler(own);
        let mut out = Vec::new();
        let mut batch = LlamaBatch::new(1, 1);
        let mut logits_idx = -1;
        while (out.len() as u32) < max {
            if abort.load(Ordering::Relaxed) {
                return Err(EngineError::Aborted);
            }
            let t = sampler.sample(self.ctx, logits_idx);
            if out.is_empty() {
                stats.ttft_ms = started.elapsed().as_millis() as u64;
            }
            if self.engine.is_eog(t) {
                break;
            }
            // `sample` has already accepted `t` into the chain (llama_sampler_sample does):
            // accepting again would count every token twice in the penalty window.
            out.push(t);
            sink.token(self.engine, t);
            batch.clear();
            let pos = (self.tokens.len() + out.len() - 1) as i32;
            batch
                .add(t, pos, &[SEQ], true)
                .map_err(|e| EngineError::Decode(e.to_string()))?;
            self.ctx
                .decode(&mut batch)
                .map_err(|e| EngineError::Decode(e.to_string()))?;
            logits_idx = 0;
            if self.engine.stops(own, &out) {
                break;
            }
        }
        self.tokens.extend_from_slice(&out);
        if let Some(last) = self.segments.last_mut() {
            last.len += out.len() as u32;
        }
        stats.generate_ms = started.elapsed().as_millis() as u64;
        sink.finished(self.engine, &out);
        Ok(out)
    }

    /// Removes positions `[p0, p1)` and shifts the rest down so positions stay contiguous.
    /// Segments overlapping the range shrink; empty ones disappear.
    pub fn remove(&mut self, p0: u32, p1: u32) -> Result<()> {
        if p0 >= p1 {
            return Ok(());
        }
        let ctx_err = |e: llama_cpp_2::context::kv_cache::KvCacheConversionError| {
            EngineError::Context(e.to_string())
        };
        self.ctx
            .kv_cache_seq_rm(SEQ, Some(p0), Some(p1))
            .map_err(ctx_err)?;
        if (p1 as usize) < self.tokens.len() {
            self.ctx
                .kv_cache_seq_add(SEQ, Some(p1), None, -((p1 - p0) as i32))
                .map_err(ctx_err)?;
        }
        self.tokens.drain(p0 as usize..p1 as usize);
        let mut pos = 0u32;
        for seg in &mut self.segments {
            let (s0, s1) = (pos, pos + seg.len);
            pos = s1;
            let overlap = s1.min(p1).saturating_sub(s0.max(p0));
            seg.len -= overlap;
        }
        self.segments.retain(|s| s.len > 0);
        Ok(())
    }

    /// Removes every position from `start` on.
    pub fn truncate_tail(&mut self, start: u32) -> Result<()> {
        self.remove(start, self.len())
    }

    /// Drops the oldest segments, whole, until at most `max` tokens remain. The base prompt
    /// and the HUD are never touched, and the newest digest and the newest context block
    /// are kept while anything else can go (they go last, context before digest), so the
    /// world state and the user's context stay in the KV instead of being re-injected.
    /// Returns tokens dropped.
    pub fn prune_to(&mut self, max: u32) -> Result<u32> {
        let over = self.len().saturating_sub(max);
        if over == 0 {
            return Ok(0);
        }
        let newest = |kind| self.segments.iter().rposition(|s| s.kind == kind);
        let keep_digest = newest(SegKind::Digest);
        let keep_context = newest(SegKind::Context);
        let droppable = (0..self.segments.len())
            .filter(|&i| {
                !matches!(self.segments[i].kind, SegKind::Base | SegKind::Hud)
                    && Some(i) != keep_digest
                    && Some(i) != keep_context
            })
            .chain(keep_context)
            .chain(keep_digest);
        let mut doomed = vec![false; self.segments.len()];
        let mut left = over;
        for i in droppable {
            if left == 0 {
                break;
            }
            doomed[i] = true;
            left = left.saturating_sub(self.segments[i].len);
        }
        self.drop_segments(&doomed)
    }

    /// Drops the segments marked in `doomed`. Everything after the first dropped segment
    /// is decoded again, segment by segment: a position shift would keep values computed
    /// while the dropped tokens were still visible, which no rebuild from the remaining
    /// tokens can reproduce. Afterwards the KV equals a fresh decode of what it holds.
    /// Returns tokens dropped.
    fn drop_segments(&mut self, doomed: &[bool]) -> Result<u32> {
        let Some(first) = doomed.iter().position(|&d| d) else {
            return Ok(0);
        };
        let cut: u32 = self.segments[..first].iter().map(|s| s.len).sum();
        let mut at = cut as usize;
        let mut kept = Vec::new();
        let mut dropped = 0;
        for (seg, gone) in self.segments[first..].iter().zip(&doomed[first..]) {
            let span = at..at + seg.len as usize;
            at = span.end;
            if *gone {
                dropped += seg.len;
            } else {
                kept.push((seg.clone(), self.tokens[span].to_vec()));
            }
        }
        self.truncate_tail(cut)?;
        for (seg, tokens) in kept {
            self.append_segment(&tokens, seg.kind, &seg.tag)?;
        }
        Ok(dropped)
    }

    /// Serialises the sequence state for a snapshot.
    pub fn export_state(&self) -> Vec<u8> {
        super::model::export_seq(self.ctx, SEQ)
    }
}
