//! Constrained greedy generation on a llama.cpp context for the background lanes (fact
//! extraction, the memory blob merge, summaries), which share the cores with live turns:
//! they decode in small steps and wait between steps while a turn needs the cores. A
//! [`WarmContext`] remembers what its KV holds, so a call whose prompt starts like the
//! last one's (the extraction instruction, every time) decodes only what differs.

use std::sync::Arc;
use std::time::Duration;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::LlamaToken;

use super::model::Engine;

const PENALTY_LAST_N: i32 = 64;
const PENALTY_REPEAT: f32 = 1.1;
const SEQ: i32 = 0;

/// Why a generation failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("llama.cpp refused the grammar: {0}")]
    Grammar(String),
    #[error("prompt of {prompt} tokens plus {max_tokens} to generate does not fit the context of {n_ctx}")]
    TooLong {
        prompt: usize,
        max_tokens: u32,
        n_ctx: u32,
    },
    #[error("decode failed: {0}")]
    Decode(String),
}

/// True while live turns need the cores; a background lane waits between decode steps
/// until it is false. The runner builds it from its turn slots.
pub type Busy = Arc<dyn Fn() -> bool + Send + Sync>;

/// How often a paused lane looks again.
const PAUSE_POLL: Duration = Duration::from_millis(5);

/// Prompt tokens per decode step in a background lane. A turn that arrives mid-step waits
/// for the step to end: at the engine's whole batch (512) that was +1.2 s at the median on
/// two cores; docs/benchmarks.md's "Summaries" has the figures at this size
/// (`ops/bench-summary latency`).
pub const BACKGROUND_PREFILL_CHUNK: usize = 32;

/// Blocks while `busy` says a live turn needs the cores: the `before_decode` of a lane.
pub fn give_way(busy: Option<&Busy>) {
    while busy.is_some_and(|b| b()) {
        std::thread::sleep(PAUSE_POLL);
    }
}

/// A context and the tokens its KV holds (prompt and answer of the last call), so the
/// next call keeps their common prefix instead of prefilling it again.
pub struct WarmContext {
    pub ctx: LlamaContext<'static>,
    held: Vec<LlamaToken>,
}

impl WarmContext {
    pub fn new(ctx: LlamaContext<'static>) -> WarmContext {
        WarmContext {
            ctx,
            held: Vec::new(),
        }
    }

    /// Tokens of the last prompt that the current call did not prefill again.
    pub fn held_len(&self) -> usize {
        self.held.len()
    }
}

/// One generation's request: `system` as the system message, `user` as the user message,
/// then the assistant's answer, greedy with a repetition penalty, optionally constrained
/// by a GBNF grammar (root rule `root`), at most `max_tokens` long.
pub struct Ask<'a> {
    pub system: &'a str,
    pub user: &'a str,
    pub grammar: Option<&'a str>,
    pub max_tokens: u32,
}

/// Generation with the model's chat frame (see [`Ask`]) on a cold context (its KV is
/// cleared first and left holding this exchange); returns the answer and whether the
/// budget cut it off. `before_decode` runs before every decode step: a background lane
/// blocks there while a live turn needs the cores, so a job already running gives way
/// within one step instead of slowing the turn down to its end. The prompt is decoded
/// `prefill_chunk` tokens per step: a step cannot be interrupted, so a smaller chunk is a
/// shorter wait for the turn (at some cost in prefill speed; a different chunk size also
/// changes llama.cpp's arithmetic slightly, and so a greedy answer).
pub fn generate_yielding(
    engine: &Engine,
    ctx: &mut LlamaContext<'_>,
    ask: &Ask,
    prefill_chunk: usize,
    before_decode: &mut dyn FnMut(),
) -> Result<(String, bool), GenerateError> {
    run(
        engine,
        ctx,
        &mut Vec::new(),
        ask,
        prefill_chunk,
        before_decode,
    )
}

/// [`generate_yielding`] on a [`WarmContext`]: the prefix this prompt shares with what the
/// KV holds is not decoded again. Greedy decoding over the same tokens at the same
/// positions gives the same answer either way (the tests compare both).
pub fn generate_warm(
    engine: &Engine,
    warm: &mut WarmContext,
    ask: &Ask<'_>,
    prefill_chunk: usize,
    before_decode: &mut dyn FnMut(),
) -> Result<(String, bool), GenerateError> {
    run(
        engine,
        &mut warm.ctx,
        &mut warm.held,
        ask,
        prefill_chunk,
        before_decode,
    )
}

fn run(
    engine: &Engine,
    ctx: &mut LlamaContext<'_>,
    held: &mut Vec<LlamaToken>,
    ask: &Ask<'_>,
    prefill_chunk: usize,
    before_decode: &mut dyn FnMut(),
) -> Result<(String, bool), GenerateError> {
    let mut prompt = engine.base_tokens(ask.system);
    prompt.extend(engine.block(&engine.frame.user, &[ask.user]));
    let n_ctx = ctx.n_ctx();
    if prompt.len() + ask.max_tokens as usize > n_ctx as usize {
        return Err(GenerateError::TooLong {
            prompt: prompt.len(),
            max_tokens: ask.max_tokens,
            n_ctx,
        });
    }
    let model = engine.model();
    let mut grammar = ask
        .grammar
        .map(|g| LlamaSampler::grammar(model, g, "root"))
        .transpose()
        .map_err(|e| GenerateError::Grammar(e.to_string()))?;
    let mut pick = LlamaSampler::chain_simple([
        LlamaSampler::penalties(model.n_vocab(), PENALTY_LAST_N, PENALTY_REPEAT, 0.0, 0.0),
        LlamaSampler::greedy(),
    ]);
    let decode_err = |e: &dyn std::fmt::Display| GenerateError::Decode(e.to_string());
    // At least the prompt's last token is decoded again: its logits start the answer.
    let keep = common_prefix(held, &prompt).min(prompt.len().saturating_sub(1));
    held.clear();
    if keep == 0 {
        ctx.clear_kv_cache();
    } else {
        ctx.clear_kv_cache_seq(Some(SEQ as u32), Some(keep as u32), None)
            .map_err(|e| decode_err(&e))?;
    }
    let n_batch = prefill_chunk.clamp(1, (engine.params.n_batch as usize).max(1));
    let mut batch = LlamaBatch::new(n_batch, 1);
    let rest = &prompt[keep..];
    for (c, chunk) in rest.chunks(n_batch).enumerate() {
        batch.clear();
        let last_chunk = (c + 1) * n_batch >= rest.len();
        for (i, &t) in chunk.iter().enumerate() {
            let logits = last_chunk && i + 1 == chunk.len();
            batch
                .add(t, (keep + c * n_batch + i) as i32, &[SEQ], logits)
                .map_err(|e| decode_err(&e))?;
        }
        before_decode();
        ctx.decode(&mut batch).map_err(|e| decode_err(&e))?;
    }
    let mut out = Vec::new();
    let mut logits_idx = batch.n_tokens() - 1;
    let mut finished = false;
    while (out.len() as u32) < ask.max_tokens {
        let t = next_token(model, ctx, logits_idx, &mut pick, grammar.as_mut())?;
        if model.vocab().is_eog(t) {
            finished = true;
            break;
        }
        out.push(t);
        batch.clear();
        batch
            .add(t, (prompt.len() + out.len() - 1) as i32, &[SEQ], true)
            .map_err(|e| decode_err(&e))?;
        before_decode();
        ctx.decode(&mut batch).map_err(|e| decode_err(&e))?;
        logits_idx = 0;
    }
    // Every token pushed was decoded: the KV now holds exactly these.
    let text = engine.detokenize(&out);
    prompt.extend(out);
    *held = prompt;
    Ok((text, !finished))
}

fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Greedy pick under the penalty, checked against the grammar. Running the grammar over
/// the whole 49k vocabulary can cost more than a decode step of a small model, so the
/// unconstrained pick is checked alone first, and the full constrained pass runs only
/// when the grammar rejects it (llama.cpp's common sampler does the same). Both samplers
/// accept the chosen token here; nothing else may accept it again.
fn next_token(
    model: &LlamaModel,
    ctx: &LlamaContext<'_>,
    idx: i32,
    pick: &mut LlamaSampler,
    grammar: Option<&mut LlamaSampler>,
) -> Result<LlamaToken, GenerateError> {
    let no_pick = || GenerateError::Decode("the sampler selected no token".into());
    let mut cur = ctx.token_data_array_ith(idx);
    pick.apply(&mut cur);
    let mut t = cur.selected_token().ok_or_else(no_pick)?;
    if let Some(g) = grammar {
        let mut single = LlamaTokenDataArray::new(vec![LlamaTokenData::new(t, 0.0, 0.0)], false);
        g.apply(&mut single);
        if single.data[0].logit() == f32::NEG_INFINITY {
            let mut cur = ctx.token_data_array_ith(idx);
            g.apply(&mut cur);
            pick.apply(&mut cur);
            t = cur.selected_token().ok_or_else(no_pick)?;
        }
        if !model.vocab().is_eog(t) {
            g.accept(t);
        }
    }
    pick.accept(t);
    Ok(t)
}
