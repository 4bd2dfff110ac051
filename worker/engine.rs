//! llama.cpp behind a safe seam: the model is loaded once per process, each context lives
//! on its own OS thread, and a [`KvSession`] tracks which tokens and segments the KV holds
//! so pruning, ephemeral spans and snapshots stay exact.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::context::session::LlamaStateSeqFlags;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use sha2::{Digest, Sha256};

use crate::config::{KvType, Settings};
use crate::snapshot::{SegKind, Segment};

/// The llama.cpp build whose state format snapshots carry (pinned in Cargo.lock).
pub const LLAMA_BUILD: &str = "llama-cpp-sys-2/0.1.161";

/// The KV sequence kvmem uses; one session per context.
const SEQ: i32 = 0;

/// Engine failures. Model problems are fatal at start-up; decode failures fail one turn.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("model file {path}: {problem}")]
    Model { path: PathBuf, problem: String },
    #[error("model file {path} has SHA-256 {actual}, but MODEL_SHA pins {expected}")]
    ShaMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("the model's chat template cannot frame a turn: {0}")]
    Template(String),
    #[error("llama.cpp context: {0}")]
    Context(String),
    #[error("decode failed: {0}")]
    Decode(String),
    #[error("KV state restore was refused by llama.cpp (other KV type or corrupt state)")]
    RestoreRefused,
    #[error("aborted")]
    Aborted,
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Context and sampling parameters taken from [`Settings`].
#[derive(Debug, Clone)]
pub struct EngineParams {
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_threads: i32,
    pub kv_type: KvType,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u32,
    pub repeat_penalty: f32,
    pub repeat_last_n: i32,
}

impl EngineParams {
    pub fn from_settings(s: &Settings) -> EngineParams {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as i32);
        EngineParams {
            n_ctx: s.n_ctx,
            n_batch: s.n_batch.max(1),
            n_threads: if s.n_threads == 0 {
                cores
            } else {
                s.n_threads as i32
            },
            kv_type: s.kv_type,
            temperature: s.temperature,
            top_p: s.top_p,
            seed: s.sampling_seed,
            repeat_penalty: s.repeat_penalty,
            repeat_last_n: s.repeat_last_n,
        }
    }
}

/// A loaded model and what is needed to frame turns for it. Shared by all engine threads.
pub struct Engine {
    model: &'static LlamaModel,
    pub model_sha: String,
    pub model_path: PathBuf,
    pub params: EngineParams,
    pub frame: ChatFrame,
}

/// The process-wide llama.cpp backend (also used by the memory embedder).
pub fn backend() -> Result<&'static LlamaBackend> {
    // llama.cpp's backend is process-global and may be initialised only once.
    static BACKEND: OnceLock<std::result::Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| LlamaBackend::init().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| EngineError::Context(e.clone()))
}

/// SHA-256 of a file, streamed.
pub fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

impl Engine {
    /// Loads the model once. Refuses a file whose hash differs from `MODEL_SHA`.
    pub fn load(path: &Path, pinned_sha: Option<&str>, params: EngineParams) -> Result<Engine> {
        let model_err = |problem: String| EngineError::Model {
            path: path.to_path_buf(),
            problem,
        };
        let sha = file_sha256(path).map_err(|e| model_err(e.to_string()))?;
        if let Some(expected) = pinned_sha {
            if !expected.eq_ignore_ascii_case(&sha) {
                return Err(EngineError::ShaMismatch {
                    path: path.to_path_buf(),
                    expected: expected.to_string(),
                    actual: sha,
                });
            }
        }
        let mut head = [0u8; 4];
        use std::io::Read;
        std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut head))
            .map_err(|e| model_err(e.to_string()))?;
        if &head != b"GGUF" {
            return Err(model_err("not a GGUF file (bad magic)".into()));
        }
        let backend = backend()?;
        let model = LlamaModel::load_from_file(backend, path, &LlamaModelParams::default())
            .map_err(|e| model_err(format!("llama.cpp could not load it: {e}")))?;
        // Loaded once per process and used by every engine thread until exit.
        let model: &'static LlamaModel = Box::leak(Box::new(model));
        let frame = ChatFrame::new(model)?;
        Ok(Engine {
            model,
            model_sha: sha,
            model_path: path.to_path_buf(),
            params,
            frame,
        })
    }

    /// A fresh context. Call it on the thread that will use it: contexts are not `Send`.
    pub fn new_context(&self) -> Result<LlamaContext<'static>> {
        let kv = match self.params.kv_type {
            KvType::F16 => KvCacheType::F16,
            KvType::Q8_0 => KvCacheType::Q8_0,
            KvType::F32 => KvCacheType::F32,
        };
        let p = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(self.params.n_ctx))
            .with_n_batch(self.params.n_batch)
            .with_n_ubatch(self.params.n_batch)
            .with_n_threads(self.params.n_threads)
            .with_n_threads_batch(self.params.n_threads)
            .with_type_k(kv)
            .with_type_v(kv);
        self.model
            .new_context(backend()?, p)
            .map_err(|e| EngineError::Context(e.to_string()))
    }

    /// The loaded model, for samplers that need its vocabulary (the grammar that constrains
    /// memory extraction to JSON).
    pub fn model(&self) -> &'static LlamaModel {
        self.model
    }

    /// Tokenizes text with no special-token parsing: user text can never forge control tokens.
    pub fn tokenize_plain(&self, text: &str) -> Vec<LlamaToken> {
        self.model.vocab().tokenize(text.as_bytes(), false, false)
    }

    /// Tokenizes template text, where special tokens such as `<|im_start|>` are meant.
    pub fn tokenize_special(&self, text: &str, add_bos: bool) -> Vec<LlamaToken> {
        self.model.vocab().tokenize(text.as_bytes(), add_bos, true)
    }

    /// Counts tokens with the model's own tokenizer.
    pub fn count_tokens(&self, text: &str) -> usize {
        self.tokenize_plain(text).len()
    }

    /// Tokens of a templated block: the frame's special parts around plain content.
    pub fn block(&self, block: &Block, content: &[&str]) -> Vec<LlamaToken> {
        let mut out = Vec::new();
        for (i, part) in block.parts.iter().enumerate() {
            out.extend(self.tokenize_special(part, false));
            if let Some(c) = content.get(i) {
                out.extend(self.tokenize_plain(c));
            }
        }
        out
    }

    /// The base system prompt, with BOS if the model wants one.
    pub fn base_tokens(&self, base_prompt: &str) -> Vec<LlamaToken> {
        let mut out = self.tokenize_special("", self.model.vocab().should_add_bos());
        out.extend(self.block(&self.frame.system, &[base_prompt]));
        out
    }

    pub fn detokenize(&self, tokens: &[LlamaToken]) -> String {
        let bytes = self.model.vocab().detokenize(tokens, true, false);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn is_eog(&self, t: LlamaToken) -> bool {
        self.model.vocab().is_eog(t)
    }

    /// Penalties, then truncation and temperature, then the pick (llama.cpp's chain order).
    /// A fresh chain per reply: its penalty window holds this reply's tokens only, so a
    /// reply is the same whether the session resumed warm or was rebuilt.
    fn sampler(&self) -> LlamaSampler {
        let p = &self.params;
        let mut chain = Vec::new();
        if p.repeat_penalty != 1.0 && p.repeat_last_n != 0 {
            chain.push(LlamaSampler::penalties(
                self.model.n_vocab(),
                p.repeat_last_n,
                p.repeat_penalty,
                0.0,
                0.0,
            ));
        }
        if p.temperature <= 0.0 {
            chain.push(LlamaSampler::greedy());
        } else {
            chain.push(LlamaSampler::top_p(p.top_p, 1));
            chain.push(LlamaSampler::temp(p.temperature));
            chain.push(LlamaSampler::dist(p.seed));
        }
        LlamaSampler::chain_simple(chain)
    }
}

/// A templated message split around its content: `parts[0] content[0] parts[1] ...`.
#[derive(Debug, Clone)]
pub struct Block {
    pub parts: Vec<String>,
}

/// The model's chat template cut into blocks, found by rendering with sentinels and
/// diffing against a rendered prefix. Works for any template llama.cpp can apply.
#[derive(Debug, Clone)]
pub struct ChatFrame {
    /// A system message (base prompt, HUD, digest).
    pub system: Block,
    /// A user message followed by the assistant's opening.
    pub user: Block,
    /// A whole past exchange, user then assistant, for cold rebuilds.
    pub exchange: Block,
    /// What closes a generated reply (`<|im_end|>\n` for ChatML).
    pub reply_close: String,
}

const SENTINEL: &str = "\u{E000}KVMEM\u{E001}";

impl ChatFrame {
    fn new(model: &LlamaModel) -> Result<ChatFrame> {
        let tmpl = model
            .chat_template(None)
            .map_err(|e| EngineError::Template(e.to_string()))?;
        let render = |msgs: &[(&str, &str)], add_ass: bool| -> Result<String> {
            let chat: Vec<LlamaChatMessage> = msgs
                .iter()
                .map(|(r, c)| LlamaChatMessage::new(r.to_string(), c.to_string()))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| EngineError::Template(e.to_string()))?;
            model
                .apply_chat_template(&tmpl, &chat, add_ass)
                .map_err(|e| EngineError::Template(e.to_string()))
        };
        Self::from_renderer(&tmpl, render)
    }

    fn from_renderer(
        _tmpl: &LlamaChatTemplate,
        render: impl Fn(&[(&str, &str)], bool) -> Result<String>,
    ) -> Result<ChatFrame> {
        let sys = ("system", "x");
        let prefix = render(&[sys], false)?;
        let after = |full: String| -> Result<String> {
            full.strip_prefix(&prefix)
                .map(str::to_string)
                .ok_or_else(|| EngineError::Template("rendering is not prefix-stable".into()))
        };
        let split = |text: String, n: usize| -> Result<Block> {
            let parts: Vec<String> = text.split(SENTINEL).map(str::to_string).collect();
            if parts.len() != n + 1 {
                return Err(EngineError::Template(
                    "content appears a wrong number of times".into(),
                ));
            }
            Ok(Block { parts })
        };
        let system = split(after(render(&[sys, ("system", SENTINEL)], false)?)?, 1)?;
        let user = split(after(render(&[sys, ("user", SENTINEL)], true)?)?, 1)?;
        let exchange = split(
            after(render(
                &[sys, ("user", SENTINEL), ("assistant", SENTINEL)],
                false,
            )?)?,
            2,
        )?;
        let opened = render(&[sys, ("user", "u")], true)?;
        let closed = render(&[sys, ("user", "u"), ("assistant", SENTINEL)], false)?;
        let reply_close = closed
            .strip_prefix(&opened)
            .and_then(|rest| rest.strip_prefix(SENTINEL))
            .ok_or_else(|| {
                EngineError::Template("assistant turn does not follow its opening".into())
            })?
            .to_string();
        Ok(ChatFrame {
            system,
            user,
            exchange,
            reply_close,
        })
    }
}

/// Timings of one generation, in milliseconds.
#[derive(Debug, Default, Clone, Copy)]
pub struct GenStats {
    pub prefill_ms: u64,
    pub ttft_ms: u64,
    pub generate_ms: u64,
}

/// The live KV of one session inside a context: token ids and segments mirror it exactly.
pub struct KvSession<'e, 'c> {
    engine: &'e Engine,
    ctx: &'c mut LlamaContext<'static>,
    tokens: Vec<LlamaToken>,
    segments: Vec<Segment>,
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

    /// Decodes `tokens` after the current tail, as one new segment (or extending the last
    /// segment when `kind` is `None`). Logits are kept for the final token only.
    pub fn append(&mut self, tokens: &[LlamaToken], kind: Option<SegKind>) -> Result<()> {
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
        match (kind, self.segments.last_mut()) {
            (None, Some(last)) => last.len += tokens.len() as u32,
            (kind, _) => self.segments.push(Segment {
                kind: kind.unwrap_or(SegKind::Turn),
                len: tokens.len() as u32,
            }),
        }
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
        let started = Instant::now();
        let mut sampler = self.engine.sampler();
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
            batch.clear();
            let pos = (self.tokens.len() + out.len() - 1) as i32;
            batch
                .add(t, pos, &[SEQ], true)
                .map_err(|e| EngineError::Decode(e.to_string()))?;
            self.ctx
                .decode(&mut batch)
                .map_err(|e| EngineError::Decode(e.to_string()))?;
            logits_idx = 0;
        }
        self.tokens.extend_from_slice(&out);
        if let Some(last) = self.segments.last_mut() {
            last.len += out.len() as u32;
        }
        stats.generate_ms = started.elapsed().as_millis() as u64;
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

    /// Removes the last `n` positions (an ephemeral span at the tail).
    pub fn truncate_tail(&mut self, start: u32) -> Result<()> {
        self.remove(start, self.len())
    }

    /// Drops the oldest segments, whole, until at most `max` tokens remain. The base prompt
    /// is never touched, and the newest digest is kept while anything else can go, so the
    /// world state stays in the KV instead of being re-injected. Returns tokens dropped.
    pub fn prune_to(&mut self, max: u32) -> Result<u32> {
        let keep_digest = self
            .segments
            .iter()
            .rposition(|s| s.kind == SegKind::Digest);
        let droppable: Vec<usize> = (0..self.segments.len())
            .filter(|&i| self.segments[i].kind != SegKind::Base && Some(i) != keep_digest)
            .chain(keep_digest)
            .collect();
        let mut over = self.len().saturating_sub(max);
        let mut doomed = vec![false; self.segments.len()];
        for i in droppable {
            if over == 0 {
                break;
            }
            doomed[i] = true;
            over = over.saturating_sub(self.segments[i].len);
        }
        // Remove from the end so earlier positions stay valid; adjacent segments merge.
        let starts: Vec<u32> = self
            .segments
            .iter()
            .scan(0u32, |pos, s| {
                let start = *pos;
                *pos += s.len;
                Some(start)
            })
            .collect();
        let mut dropped = 0;
        let mut i = doomed.len();
        while i > 0 {
            i -= 1;
            if !doomed[i] {
                continue;
            }
            let end = starts[i] + self.segments[i].len;
            let mut j = i;
            while j > 0 && doomed[j - 1] {
                j -= 1;
            }
            self.remove(starts[j], end)?;
            dropped += end - starts[j];
            i = j;
        }
        Ok(dropped)
    }

    /// Serialises the sequence state for a snapshot.
    pub fn export_state(&self) -> Vec<u8> {
        let size = self
            .ctx
            .state_seq_get_size_ext(SEQ, LlamaStateSeqFlags::empty());
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds exactly the size llama.cpp asked for.
        let n = unsafe {
            self.ctx
                .state_seq_get_data_ext(buf.as_mut_ptr(), SEQ, LlamaStateSeqFlags::empty())
        };
        buf.truncate(n);
        buf
    }
}
