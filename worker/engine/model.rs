//! A loaded model: its weights, hash and chat frame, the contexts made from it, and the
//! process-wide llama.cpp backend.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::context::session::LlamaStateSeqFlags;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::LlamaCppError;
use sha2::{Digest, Sha256};

use crate::config::{KvType, Settings};

use super::device::{place, GpuChoice, Placement};
use super::error::{EngineError, Result};
use super::frame::{Block, ChatFrame};
use super::sampling::Sampling;

/// Where a reply's tokens go while they are generated (the streamed reply), called on the
/// engine thread between decode steps: an implementation must not block.
pub trait TokenSink {
    /// A token of the reply, as soon as it is sampled (before it is decoded).
    fn token(&mut self, engine: &Engine, t: LlamaToken);
    /// The reply ended (end of turn or its token budget); `reply` is every token of it.
    fn finished(&mut self, engine: &Engine, reply: &[LlamaToken]);
}

/// No sink: a reply nobody streams.
impl TokenSink for () {
    fn token(&mut self, _: &Engine, _: LlamaToken) {}
    fn finished(&mut self, _: &Engine, _: &[LlamaToken]) {}
}

/// The llama.cpp build whose state format snapshots carry (pinned in Cargo.lock).
pub const LLAMA_BUILD: &str = "llama-cpp-sys-2/0.1.161";

/// The KV sequence of a one-session context.
pub(crate) const SEQ: i32 = 0;

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
    /// Layers on a GPU and which one (`engine.gpu_layers`, `engine.main_gpu`).
    pub gpu: GpuChoice,
}

impl EngineParams {
    pub fn from_settings(s: &Settings) -> EngineParams {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as i32);
        let e = &s.engine;
        EngineParams {
            n_ctx: e.n_ctx,
            n_batch: e.n_batch.max(1),
            n_threads: if e.n_threads == 0 {
                cores
            } else {
                e.n_threads as i32
            },
            kv_type: e.kv_type,
            temperature: e.temperature,
            top_p: e.top_p,
            seed: e.sampling_seed,
            repeat_penalty: e.repeat_penalty,
            repeat_last_n: e.repeat_last_n,
            gpu: GpuChoice {
                layers: e.gpu_layers,
                main_gpu: e.main_gpu,
            },
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
    /// The backend and device the model's layers and KV are on.
    pub placement: Placement,
}

/// The process-wide llama.cpp backend (also used by the memory embedder).
pub fn backend() -> Result<&'static LlamaBackend> {
    // llama.cpp's backend is process-global and may be initialised only once, so a failed
    // start is kept too: every later caller reads the same error from the static.
    static BACKEND: OnceLock<std::result::Result<LlamaBackend, LlamaCppError>> = OnceLock::new();
    BACKEND
        .get_or_init(LlamaBackend::init)
        .as_ref()
        .map_err(|e| EngineError::Context(e.to_string()))
}

/// One sequence's KV, in the format a one-sequence context restores.
pub(super) fn export_seq(ctx: &LlamaContext<'static>, seq: i32) -> Vec<u8> {
    let size = ctx.state_seq_get_size_ext(seq, LlamaStateSeqFlags::empty());
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds exactly the size llama.cpp asked for.
    let n =
        unsafe { ctx.state_seq_get_data_ext(buf.as_mut_ptr(), seq, LlamaStateSeqFlags::empty()) };
    buf.truncate(n);
    buf
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
        let (model_params, placement) = place(params.gpu)?;
        let model = LlamaModel::load_from_file(backend, path, &model_params)
            .map_err(|e| model_err(format!("llama.cpp could not load it: {e}")))?;
        // Loaded once per process and used by every engine thread until exit.
        let model: &'static LlamaModel = Box::leak(Box::new(model));
        let frame = ChatFrame::new(model)?;
        Ok(Engine {
            model,
            model_sha: sha,
            model_path: path.to_path_buf(),
            placement: placement.with_layers(model.n_layer(), params.gpu.layers),
            params,
            frame,
        })
    }

    /// A fresh context. Call it on the thread that will use it: contexts are not `Send`.
    pub fn new_context(&self) -> Result<LlamaContext<'static>> {
        self.context_params(self.params.n_ctx)
            .and_then(|p| self.make_context(p))
    }

    /// A context for `sessions` sessions decoded together ([`super::batch`]): one sequence and
    /// `N_CTX` cells each. The KV is unified because llama.cpp restores a one-sequence state
    /// into another sequence only then.
    pub fn new_batch_context(&self, sessions: u32) -> Result<LlamaContext<'static>> {
        let n_ctx = self.params.n_ctx.checked_mul(sessions).ok_or_else(|| {
            EngineError::Context(format!("{sessions} sessions of N_CTX cells overflow"))
        })?;
        self.context_params(n_ctx)
            .and_then(|p| self.make_context(p.with_n_seq_max(sessions).with_kv_unified(true)))
    }

    fn make_context(&self, p: LlamaContextParams) -> Result<LlamaContext<'static>> {
        self.model
            .new_context(backend()?, p)
            .map_err(|e| EngineError::Context(e.to_string()))
    }

    fn context_params(&self, n_ctx: u32) -> Result<LlamaContextParams> {
        let kv = match self.params.kv_type {
            KvType::F16 => KvCacheType::F16,
            KvType::Q8_0 => KvCacheType::Q8_0,
            KvType::F32 => KvCacheType::F32,
        };
        Ok(LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(n_ctx))
            .with_n_batch(self.params.n_batch)
            .with_n_ubatch(self.params.n_batch)
            .with_n_threads(self.params.n_threads)
            .with_n_threads_batch(self.params.n_threads)
            .with_type_k(kv)
            .with_type_v(kv))
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
        String::from_utf8_lossy(&self.detokenize_bytes(tokens)).into_owned()
    }

    /// [`Engine::detokenize`] before the UTF-8 check: the tokens of a reply still being
    /// generated can end inside a character.
    pub fn detokenize_bytes(&self, tokens: &[LlamaToken]) -> Vec<u8> {
        // llama-cpp-2 0.1.160 sizes its buffer as `2 * len - 1` for an empty slice too,
        // which underflows (a capacity-overflow panic): nothing decodes to nothing.
        if tokens.is_empty() {
            return Vec::new();
        }
        self.model.vocab().detokenize(tokens, true, false)
    }

    pub(super) fn is_eog(&self, t: LlamaToken) -> bool {
        self.model.vocab().is_eog(t)
    }

    /// Whether the reply so far, `out`, holds one of `own`'s stop strings. The loops check
    /// after each decoded token, so they stop with the token that completed it in the KV;
    /// the settle step decodes the exchange again from the cut text, so the saved KV keeps
    /// no more than the stored reply.
    pub fn stops(&self, own: &Sampling, out: &[LlamaToken]) -> bool {
        if own.stop.is_empty() || out.is_empty() {
            return false;
        }
        let text = self.detokenize(out);
        own.stop.iter().any(|s| text.contains(s.as_str()))
    }

    /// Penalties, then truncation and temperature, then the pick (llama.cpp's chain order).
    /// A fresh chain per reply: its penalty window holds this reply's tokens only, so a
    /// reply is the same whether the session resumed warm or was rebuilt. `own` overrides
    /// the configured temperature, top-p and seed for one reply.
    pub(super) fn sampler(&self, own: &Sampling) -> LlamaSampler {
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
        let temperature = own.temperature.unwrap_or(p.temperature);
        if temperature <= 0.0 {
            chain.push(LlamaSampler::greedy());
        } else {
            chain.push(LlamaSampler::top_p(own.top_p.unwrap_or(p.top_p), 1));
            chain.push(LlamaSampler::temp(temperature));
            chain.push(LlamaSampler::dist(own.seed.unwrap_or(p.seed)));
        }
        LlamaSampler::chain_simple(chain)
    }
}
