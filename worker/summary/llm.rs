//! The summary model on a thread of its own: a llama.cpp context cannot move between
//! threads, so one thread owns it and summary prompts queue for it. A prompt is fitted to
//! the context with the model's tokenizer by dropping its oldest lines, never by guessing.
//! In a worker the thread pauses between decode steps while a live turn generates, so a
//! summary never competes with a turn for the cores.

use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;

use crate::engine::generate::{self, give_way, Busy, BACKGROUND_PREFILL_CHUNK};
use crate::engine::threads::{EngineThreads, ModelStartError, RunError};
use crate::engine::Engine;

/// One summary request: a system message, then the user message built from `header`, the
/// input `lines` (oldest first; the oldest are dropped to fit) and `footer`.
#[derive(Debug, Clone, Default)]
pub struct Prompt {
    pub system: String,
    pub header: String,
    pub lines: Vec<String>,
    pub footer: String,
    /// A GBNF grammar (root rule `root`) the answer must follow.
    pub grammar: Option<String>,
    pub max_tokens: u32,
}

/// What the model answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub text: String,
    /// The token budget ran out before the model finished.
    pub truncated: bool,
    /// Input lines left out so the prompt fits the context.
    pub lines_dropped: usize,
    pub elapsed_ms: u64,
}

type Reply = std::result::Result<Generated, ModelError>;

/// Why the summary model gave no text: its thread is gone, the prompt does not fit its
/// context, or generation failed. The text is what the job's error records.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ModelError(pub String);

/// The model thread and a handle on its engine (for token counts, which need no context).
pub struct Summarizer {
    thread: EngineThreads<LlamaContext<'static>>,
    /// Pauses every summary between decode steps while a live turn needs the cores.
    busy: Option<Busy>,
}

impl Summarizer {
    /// Creates the context on a new thread; fails if llama.cpp cannot make one.
    pub fn start(
        engine: Arc<Engine>,
        busy: Option<Busy>,
    ) -> std::result::Result<Summarizer, ModelStartError> {
        let names = std::iter::once("kvmem-summary".to_string());
        let thread = EngineThreads::start(engine, names, Engine::new_context)
            .map_err(|e| e.for_model("summary"))?;
        Ok(Summarizer { thread, busy })
    }

    /// Runs one prompt on the model thread.
    pub async fn generate(&self, prompt: Prompt) -> Reply {
        let busy = self.busy.clone();
        self.thread
            .run(move |engine, ctx| run(engine, ctx, prompt, busy.as_ref()))
            .await
            .map_err(stopped)?
    }

    /// [`Summarizer::generate`] for blocking code (run it on a blocking thread).
    pub fn generate_blocking(&self, prompt: Prompt) -> Reply {
        let busy = self.busy.clone();
        self.thread
            .run_blocking(move |engine, ctx| run(engine, ctx, prompt, busy.as_ref()))
            .map_err(stopped)?
    }

    /// Tokens of `text` as the model counts them.
    pub fn count_tokens(&self, text: &str) -> usize {
        self.engine().count_tokens(text)
    }

    pub fn engine(&self) -> &Arc<Engine> {
        self.thread.engine()
    }
}

fn stopped(e: RunError) -> ModelError {
    ModelError(
        match e {
            RunError::Gone => "summary thread is gone",
            RunError::Stopped => "summary thread stopped",
        }
        .to_string(),
    )
}

fn run(engine: &Engine, ctx: &mut LlamaContext<'static>, p: Prompt, busy: Option<&Busy>) -> Reply {
    let started = Instant::now();
    let n_ctx = ctx.n_ctx() as usize;
    let fixed = engine.base_tokens(&p.system).len()
        + engine
            .block(
                &engine.frame.user,
                &[&format!("{}\n{}", p.header, p.footer)],
            )
            .len();
    let budget = n_ctx
        .checked_sub(fixed + p.max_tokens as usize + 8)
        .ok_or_else(|| {
            ModelError(format!(
                "prompt of {fixed} tokens plus {} to generate does not fit the context of {n_ctx}",
                p.max_tokens
            ))
        })?;
    let (lines, dropped) = fit_lines(engine, &p.lines, budget);
    let user = format!("{}\n{}\n{}", p.header, lines.join("\n"), p.footer);
    let mut wait = || give_way(busy);
    let ask = generate::Ask {
        system: &p.system,
        user: &user,
        grammar: p.grammar.as_deref(),
        max_tokens: p.max_tokens,
    };
    let (text, truncated) =
        generate::generate_yielding(engine, ctx, &ask, BACKGROUND_PREFILL_CHUNK, &mut wait)
            .map_err(|e| ModelError(e.to_string()))?;
    Ok(Generated {
        text: text.trim().to_string(),
        truncated,
        lines_dropped: dropped,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// The newest lines that fit `budget` tokens together (one token per line break), in order.
fn fit_lines<'a>(engine: &Engine, lines: &'a [String], budget: usize) -> (Vec<&'a str>, usize) {
    let mut used = 0;
    let mut kept = Vec::new();
    for line in lines.iter().rev() {
        let n = engine.count_tokens(line) + 1;
        if used + n > budget {
            break;
        }
        used += n;
        kept.push(line.as_str());
    }
    kept.reverse();
    let dropped = lines.len() - kept.len();
    (kept, dropped)
}
