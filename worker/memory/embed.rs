//! Sentence embeddings on llama.cpp (a BERT-family GGUF with mean pooling: all-MiniLM-L6-v2
//! or multilingual-e5-small), so semantic retrieval runs locally next to the chat model
//! without another service. Every vector carries the id of the file that made it, so a
//! query is never compared with another model's vectors.

use std::collections::HashMap;
use std::io::Read;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use sha2::{Digest, Sha256};

use crate::engine::device::{place, GpuChoice, Placement};

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
/// The window of a model whose file names none: all-MiniLM-L6-v2's (sentence-transformers
/// cuts its input at 256 word pieces; it was trained on 128).
pub const DEFAULT_WINDOW: usize = 256;
/// GGUF keys a converter may add (ops/convert_e5.py does): the prefix the model was trained
/// with on each side of a search, and its window in tokens.
const QUERY_PREFIX_KEY: &str = "kvmem.embed.query_prefix";
const PASSAGE_PREFIX_KEY: &str = "kvmem.embed.passage_prefix";
const WINDOW_KEY: &str = "kvmem.embed.max_tokens";
/// The cosine at which a line counts as about a message (recall's gate). Each model's
/// cosines live in their own range (e5's unrelated pairs sit near 0.78, MiniLM's near
/// 0.05), so the threshold travels with the model.
const RELATED_COSINE_KEY: &str = "kvmem.embed.related_cosine";
/// The threshold for a model without the key: MiniLM's, where the gate was first set.
const DEFAULT_RELATED_COSINE: f64 = 0.30;
/// Hex digits of the file's sha256 that name a model in the database.
const ID_HEX: usize = 16;

/// Which end of a text longer than the model's window is embedded. A message's key starts
/// with the message (its context follows), so the start; a span ends with its own message
/// (the turns before it come first), so the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    Start,
    End,
}

/// Which side of a search a text is on. Asymmetric models (e5) were trained with a prefix
/// on each side; for the others both sides are the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A question asked of the memory (a search's query).
    Query,
    /// Something stored to be found (a message's key, a span, a fact, a memory line).
    Passage,
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
    /// The file's name, for messages and the CLI.
    pub name: String,
    /// The first 16 hex digits of the file's sha256: stored with each vector; a query is
    /// compared only with vectors of its own id.
    pub id: String,
    query_prefix: String,
    passage_prefix: String,
    /// Tokens a text may have, [BOS] and [EOS] included.
    window: usize,
    /// The cosine from which a text is taken to be about a query (the GGUF key `kvmem.embed.related_cosine`).
    pub related_cosine: f64,
    /// The backend and device the model runs on.
    pub placement: Placement,
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
        Self::shared_on(path, n_threads, GpuChoice::CPU)
    }

    /// [`Embedder::shared`] with `gpu`'s layers on a GPU, for the first load (the one copy
    /// stays where that load put it).
    pub fn shared_on(path: &Path, n_threads: i32, gpu: GpuChoice) -> Result<Arc<Embedder>> {
        let mut map = loaded()
            .lock()
            .map_err(|_| EmbedError::Llama("embedder registry poisoned by a panic".into()))?;
        if let Some(e) = map.get(path) {
            return Ok(e.clone());
        }
        let e = Arc::new(Embedder::load_on(path, n_threads, gpu)?);
        map.insert(path.to_path_buf(), e.clone());
        Ok(e)
    }

    pub fn load(path: &Path, n_threads: i32) -> Result<Embedder> {
        Self::load_on(path, n_threads, GpuChoice::CPU)
    }

    /// A copy of the model at `path` with `gpu`'s layers on a GPU.
    pub fn load_on(path: &Path, n_threads: i32, gpu: GpuChoice) -> Result<Embedder> {
        Self::load_with(path, n_threads, QUERY_THREADS, gpu)
    }

    /// [`Embedder::load`] with `query_threads` threads for a single text instead of one:
    /// how `ops/bench-embed` sets one thread against two side by side.
    pub fn load_with_query_threads(
        path: &Path,
        n_threads: i32,
        query_threads: i32,
    ) -> Result<Embedder> {
        Self::load_with(path, n_threads, query_threads, GpuChoice::CPU)
    }

    fn load_with(
        path: &Path,
        n_threads: i32,
        query_threads: i32,
        gpu: GpuChoice,
    ) -> Result<Embedder> {
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
        let id = file_id(path).map_err(|e| err(format!("reading it for its sha256: {e}")))?;
        let backend = crate::engine::backend().map_err(|e| err(e.to_string()))?;
        let (params, placement) = place(gpu).map_err(|e| err(e.to_string()))?;
        let model = LlamaModel::load_from_file(backend, path, &params)
            .map_err(|e| err(format!("llama.cpp could not load it: {e}")))?;
        // Loaded once per process, like the chat model.
        let model: &'static LlamaModel = Box::leak(Box::new(model));
        let dims = model.n_embd() as usize;
        if crate::memory::columns::Columns::of_width(dims).is_none() {
            return Err(err(format!(
                "its vectors are {dims} wide; memory_messages has columns {:?} wide",
                crate::memory::columns::WIDTHS
            )));
        }
        let meta = |key: &str| model.meta_val_str(key).ok();
        let window = meta(WINDOW_KEY)
            .and_then(|w| w.parse::<usize>().ok())
            .unwrap_or(DEFAULT_WINDOW)
            .min(model.n_ctx_train() as usize)
            .min(BATCH_TOKENS);
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
        let query = context(window, 1, query_threads.max(1))?;
        Ok(Embedder {
            model,
            ctx: Mutex::new(ctx),
            query: Mutex::new(query),
            dims,
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            id,
            query_prefix: meta(QUERY_PREFIX_KEY).unwrap_or_default(),
            passage_prefix: meta(PASSAGE_PREFIX_KEY).unwrap_or_default(),
            window,
            placement: placement.with_layers(model.n_layer(), gpu.layers),
            related_cosine: meta(RELATED_COSINE_KEY)
                .and_then(|c| c.trim().parse::<f64>().ok())
                .filter(|c| c.is_finite())
                .unwrap_or(DEFAULT_RELATED_COSINE),
        })
    }

    /// Tokens a text may have, BOS and EOS included.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The token ids a text is embedded as: the model's prefix for `role` before it, its
    /// whitespace runs made single spaces ([`canonical`]), cut to the window.
    pub fn token_ids(&self, text: &str, role: Role, keep: Keep) -> Vec<LlamaToken> {
        let prefix = match role {
            Role::Query => self.query_prefix.as_str(),
            Role::Passage => self.passage_prefix.as_str(),
        };
        let tokenize = |s: &str| self.model.vocab().tokenize(s.as_bytes(), true, false);
        let mut t = tokenize(&canonical(&format!("{prefix}{text}")));
        if t.len() > self.window {
            match keep {
                Keep::Start => {
                    let last = *t.last().expect("non-empty");
                    t.truncate(self.window - 1);
                    t.push(last);
                }
                // [BOS] and the prefix, then the last tokens, which end with [EOS].
                Keep::End => {
                    let head = 1 + self.prefix_len(prefix, &t[1..]);
                    t.drain(head..t.len() - (self.window - head));
                }
            }
        }
        if t.is_empty() {
            t = tokenize(" ");
        }
        t
    }

    /// How many of `tokens`' first tokens spell `prefix` on its own (0 when there is none).
    fn prefix_len(&self, prefix: &str, tokens: &[LlamaToken]) -> usize {
        let own = self.model.vocab().tokenize(prefix.as_bytes(), false, false);
        let n = own.len().min(tokens.len());
        let same = own.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        if same == n {
            n
        } else {
            0
        }
    }

    /// L2-normalised vectors, one per text, in order. Several texts share each encode
    /// call: per-call overhead dominates for short chat messages. A single text (a
    /// search's query) goes to the one-thread context: the same vector (the probe of
    /// issue 33 compared them bit for bit), without waiting on a batch in progress.
    pub fn embed(&self, texts: &[String], role: Role) -> Result<Vec<Vec<f32>>> {
        self.embed_keeping(texts, role, Keep::Start)
    }

    /// [`Embedder::embed`], keeping `keep`'s end of a text longer than the model's window.
    pub fn embed_keeping(&self, texts: &[String], role: Role, keep: Keep) -> Result<Vec<Vec<f32>>> {
        let toks: Vec<Vec<LlamaToken>> = texts
            .iter()
            .map(|t| self.token_ids(t, role, keep))
            .collect();
        let poisoned = |_| EmbedError::Llama("embedder poisoned by an earlier panic".into());
        if let [one] = toks.as_slice() {
            let mut ctx = self.query.lock().map_err(poisoned)?;
            return encode(&mut ctx, std::slice::from_ref(one), self.window, 1);
        }
        let mut ctx = self.ctx.lock().map_err(poisoned)?;
        encode(&mut ctx, &toks, BATCH_TOKENS, BATCH_SEQS)
    }
}

/// Each run of whitespace made one space, and none at the start. What a text says does not
/// depend on its layout. e5's own engine (like HF's tokenizer) collapses runs of spaces but
/// keeps a trailing one as a token; its GGUF leaves whitespace to kvmem, so that this rule
/// gives llama.cpp the same pieces. WordPiece models (MiniLM) ignore whitespace anyway.
pub fn canonical(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut space = false;
    for c in text.trim_start().chars() {
        if c.is_whitespace() {
            space = true;
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        out.push(c);
    }
    if space {
        out.push(' ');
    }
    out
}

/// The first [`ID_HEX`] hex digits of the file's sha256.
fn file_id(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let mut id = hex::encode(h.finalize());
    id.truncate(ID_HEX);
    Ok(id)
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
