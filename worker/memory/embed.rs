//! Sentence embeddings on llama.cpp (all-MiniLM-L6-v2 as a BERT GGUF, mean pooling), so
//! semantic retrieval runs locally next to the chat model without another service.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

/// Tokens per encode call: every sequence of a non-causal batch must fit one ubatch. Not
/// more: llama.cpp computes attention over the whole ubatch and masks across sequences,
/// so the attention cost per token grows with the batch size. 512 tokens: 92.7 msgs/s
/// on a quiet machine (ops/bench-memory); 2048 was not re-measured side by side.
const BATCH_TOKENS: usize = 512;
/// Sequences per encode call.
const BATCH_SEQS: usize = 32;
/// Threads of the single-text context. A short query is a few milliseconds of work, and
/// llama.cpp's threads wait on each other by spinning: two threads on two busy cores took
/// 16 / 719 ms p50 / p95 for one query where one thread took 9 / 15 ms, side by side in one
/// run (issue 33).
const QUERY_THREADS: i32 = 1;
/// MiniLM was trained on 128 word pieces and knows 512 positions; longer text is cut.
pub const MAX_TOKENS: usize = 256;

/// Which end of a text longer than [`MAX_TOKENS`] is embedded. A message's key starts with
/// the message (its context follows), so the start; a span ends with its own message (the
/// turns before it come first), so the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    Start,
    End,
}

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("embedding model {path}: {problem}")]
    Model { path: PathBuf, problem: String },
    #[error("llama.cpp: {0}")]
    Llama(String),
}

pub type Result<T, E = EmbedError> = std::result::Result<T, E>;

/// A loaded embedding model and two reusable contexts (not thread-safe in llama.cpp, so
/// calls take turns on a mutex): one for batches, on every thread, and one for a single
/// text (a search's query), on one thread.
pub struct Embedder {
    model: &'static LlamaModel,
    ctx: Mutex<LlamaContext<'static>>,
    query: Mutex<LlamaContext<'static>>,
    pub dims: usize,
    /// `file-name` of the model: stored with each vector so a model change is visible.
    pub name: String,
}

/// The models this process has loaded, by file: llama.cpp models are leaked (they live as
/// long as the process), so every service that wants one shares the first load.
fn loaded() -> &'static Mutex<HashMap<PathBuf, Arc<Embedder>>> {
    static LOADED: OnceLock<Mutex<HashMap<PathBuf, Arc<Embedder>>>> = OnceLock::new();
    LOADED.get_or_init(Default::default)
}

/// How many times this process has loaded the model at `path` (at most once, unless a
/// caller used [`Embedder::load`] directly).
pub fn loads(path: &Path) -> usize {
    load_counts()
        .lock()
        .map(|c| c.get(path).copied().unwrap_or(0))
        .unwrap_or(0)
}

fn load_counts() -> &'static Mutex<HashMap<PathBuf, usize>> {
    static COUNTS: OnceLock<Mutex<HashMap<PathBuf, usize>>> = OnceLock::new();
    COUNTS.get_or_init(Default::default)
}

impl Embedder {
    /// The process's one copy of the model at `path`, loaded on first use. The lock is
    /// held through the load so two services starting together load it once.
    pub fn shared(path: &Path, n_threads: i32) -> Result<Arc<Embedder>> {
        let mut map = loaded()
            .lock()
            .map_err(|_| EmbedError::Llama("embedder registry poisoned by a panic".into()))?;
        if let Some(e) = map.get(path) {
            return Ok(e.clone());
        }
        let e = Arc::new(Embedder::load(path, n_threads)?);
        map.insert(path.to_path_buf(), e.clone());
        Ok(e)
    }

    pub fn load(path: &Path, n_threads: i32) -> Result<Embedder> {
        if let Ok(mut c) = load_counts().lock() {
            *c.entry(path.to_path_buf()).or_default() += 1;
        }
        let err = |problem: String| EmbedError::Model {
            path: path.to_path_buf(),
            problem,
        };
        if !path.exists() {
            return Err(err("file does not exist".into()));
        }
        let backend = crate::engine::backend().map_err(|e| err(e.to_string()))?;
        let model = LlamaModel::load_from_file(backend, path, &LlamaModelParams::default())
            .map_err(|e| err(format!("llama.cpp could not load it: {e}")))?;
        // Loaded once per process, like the chat model.
        let model: &'static LlamaModel = Box::leak(Box::new(model));
        let context = |tokens: usize, seqs: usize, threads: i32| {
            let params = LlamaContextParams::default()
                .with_n_ctx(NonZeroU32::new(tokens as u32))
                .with_n_batch(tokens as u32)
                .with_n_ubatch(tokens as u32)
                .with_n_seq_max(seqs as u32)
                .with_kv_unified(true)
                .with_n_threads(threads)
                .with_n_threads_batch(threads)
                .with_embeddings(true)
                .with_pooling_type(LlamaPoolingType::Mean);
            model
                .new_context(backend, params)
                .map_err(|e| err(format!("context: {e}")))
        };
        let ctx = context(BATCH_TOKENS, BATCH_SEQS, n_threads)?;
        let query = context(MAX_TOKENS, 1, QUERY_THREADS)?;
        let dims = model.n_embd() as usize;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Embedder {
            model,
            ctx: Mutex::new(ctx),
            query: Mutex::new(query),
            dims,
            name,
        })
    }

    fn tokens(&self, text: &str, keep: Keep) -> Vec<LlamaToken> {
        let mut t = self.model.vocab().tokenize(text.as_bytes(), true, false);
        if t.len() > MAX_TOKENS {
            match keep {
                Keep::Start => {
                    let last = *t.last().expect("non-empty");
                    t.truncate(MAX_TOKENS - 1);
                    t.push(last);
                }
                // The first token ([CLS]) and the last MAX_TOKENS - 1, which end with [SEP].
                Keep::End => {
                    t.drain(1..t.len() - (MAX_TOKENS - 1));
                }
            }
        }
        if t.is_empty() {
            t = self.model.vocab().tokenize(b" ", true, false);
        }
        t
    }

    /// L2-normalised vectors, one per text, in order. Several texts share each encode
    /// call: per-call overhead dominates for short chat messages. A single text (a
    /// search's query) goes to the one-thread context: the same vector (the probe of
    /// issue 33 compared them bit for bit), without waiting on a batch in progress.
    pub fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        self.embed_keeping(texts, Keep::Start)
    }

    /// [`Embedder::embed`], keeping `keep`'s end of a text longer than the model's window.
    pub fn embed_keeping(&self, texts: &[String], keep: Keep) -> Result<Vec<Vec<f32>>> {
        let toks: Vec<Vec<LlamaToken>> = texts.iter().map(|t| self.tokens(t, keep)).collect();
        let poisoned = |_| EmbedError::Llama("embedder poisoned by an earlier panic".into());
        if let [one] = toks.as_slice() {
            let mut ctx = self.query.lock().map_err(poisoned)?;
            return encode(&mut ctx, std::slice::from_ref(one), MAX_TOKENS, 1);
        }
        let mut ctx = self.ctx.lock().map_err(poisoned)?;
        encode(&mut ctx, &toks, BATCH_TOKENS, BATCH_SEQS)
    }
}

/// Encodes `toks` in calls of at most `seqs` sequences and `tokens` tokens each.
fn encode(
    ctx: &mut LlamaContext<'static>,
    toks: &[Vec<LlamaToken>],
    tokens: usize,
    seqs: usize,
) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::with_capacity(toks.len());
    let mut start = 0;
    while start < toks.len() {
        let mut end = start;
        let mut n = 0;
        while end < toks.len() && end - start < seqs && n + toks[end].len() <= tokens {
            n += toks[end].len();
            end += 1;
        }
        let mut batch = LlamaBatch::new(tokens, seqs as i32);
        for (seq, t) in toks[start..end].iter().enumerate() {
            batch
                .add_sequence(t, seq as i32, true)
                .map_err(|e| EmbedError::Llama(e.to_string()))?;
        }
        ctx.clear_kv_cache();
        ctx.encode(&mut batch)
            .map_err(|e| EmbedError::Llama(format!("encode: {e}")))?;
        for seq in 0..(end - start) {
            let v = ctx
                .embeddings_seq_ith(seq as i32)
                .map_err(|e| EmbedError::Llama(format!("embeddings: {e}")))?;
            out.push(normalise(v));
        }
        start = end;
    }
    Ok(out)
}

pub fn normalise(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|x| x / norm).collect()
}

/// Vectors are stored as little-endian f32 `bytea`: compact, and one memcpy to read.
pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(v.len() * 4);
    for x in v {
        b.extend_from_slice(&x.to_le_bytes());
    }
    b
}

pub fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Cosine of two L2-normalised vectors; 0 for a dimension mismatch (another model).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Cosine straight from the stored bytes, without allocating.
pub fn dot_bytes(q: &[f32], b: &[u8]) -> f32 {
    if b.len() != q.len() * 4 {
        return 0.0;
    }
    let mut s = 0.0f32;
    for (x, c) in q.iter().zip(b.chunks_exact(4)) {
        s += x * f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    s
}
