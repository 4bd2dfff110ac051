//! Engine threads, each owning its llama.cpp contexts: a context cannot move between
//! threads, and llama.cpp work must never block the tokio runtime.

use std::sync::Arc;

use llama_cpp_2::context::LlamaContext;

use super::error::EngineError;
use super::model::Engine;
use super::threads::{EngineThreads, RunError, StartError};

/// One engine thread's contexts.
pub struct Contexts {
    /// A one-sequence context: every turn runs here, or starts and ends here when it is
    /// decoded with others.
    pub work: LlamaContext<'static>,
    /// The multi-sequence context where sessions are decoded together; `None` when the
    /// pool batches no sessions.
    pub batch: Option<LlamaContext<'static>>,
}

/// Engine threads, each owning its contexts. Jobs never run on the tokio runtime.
pub struct EnginePool {
    threads: EngineThreads<Contexts>,
    slots: u32,
    batch_sessions: u32,
}

impl EnginePool {
    /// Starts `slots` threads and creates their contexts (with a context for
    /// `batch_sessions` sequences each when that is above 1); fails if any context cannot be
    /// made.
    pub fn start(
        engine: Arc<Engine>,
        slots: u32,
        batch_sessions: u32,
    ) -> Result<EnginePool, EngineError> {
        let names = (0..slots).map(|slot| format!("kvmem-engine-{slot}"));
        let threads = EngineThreads::start(engine, names, move |engine: &Engine| {
            let work = engine.new_context()?;
            let batch = (batch_sessions > 1)
                .then(|| engine.new_batch_context(batch_sessions))
                .transpose()?;
            Ok(Contexts { work, batch })
        })
        .map_err(|e| match e {
            StartError::Spawn(e) => EngineError::Context(e.to_string()),
            StartError::Make(e) => e,
            StartError::Died => EngineError::Context("engine thread died".into()),
        })?;
        Ok(EnginePool {
            threads,
            slots,
            batch_sessions,
        })
    }

    pub fn engine(&self) -> &Arc<Engine> {
        self.threads.engine()
    }

    /// Engine threads.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Sessions one thread decodes together (1: one at a time).
    pub fn batch_sessions(&self) -> u32 {
        self.batch_sessions
    }

    /// Runs `f` on an engine thread's one-sequence context and awaits its result.
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine, &mut LlamaContext<'static>) -> R + Send + 'static,
    ) -> Result<R, EngineError> {
        self.run_with_contexts(move |engine, ctxs| f(engine, &mut ctxs.work))
            .await
    }

    /// Runs `f` on an engine thread with all of its contexts and awaits its result.
    pub async fn run_with_contexts<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine, &mut Contexts) -> R + Send + 'static,
    ) -> Result<R, EngineError> {
        self.threads.run(f).await.map_err(|e| {
            EngineError::Context(
                match e {
                    RunError::Gone => "engine threads are gone",
                    RunError::Stopped => "engine thread panicked",
                }
                .into(),
            )
        })
    }
}
