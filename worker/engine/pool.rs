//! Engine threads, each owning its llama.cpp contexts: a context cannot move between
//! threads, and llama.cpp work must never block the tokio runtime.

use std::sync::{mpsc, Arc, Mutex};

use llama_cpp_2::context::LlamaContext;

use super::{Engine, EngineError};

type Job = Box<dyn FnOnce(&Engine, &mut Contexts) + Send>;

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
    engine: Arc<Engine>,
    jobs: mpsc::Sender<Job>,
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
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for slot in 0..slots {
            let (engine, rx) = (engine.clone(), rx.clone());
            let (ready_tx, ready_rx) = mpsc::channel();
            std::thread::Builder::new()
                .name(format!("kvmem-engine-{slot}"))
                .spawn(move || {
                    let made = engine.new_context().and_then(|work| {
                        let batch = (batch_sessions > 1)
                            .then(|| engine.new_batch_context(batch_sessions))
                            .transpose()?;
                        Ok(Contexts { work, batch })
                    });
                    let mut ctxs = match made {
                        Ok(ctxs) => {
                            let _ = ready_tx.send(Ok(()));
                            ctxs
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    loop {
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(&engine, &mut ctxs),
                            Err(_) => return,
                        }
                    }
                })
                .map_err(|e| EngineError::Context(e.to_string()))?;
            ready_rx
                .recv()
                .map_err(|_| EngineError::Context("engine thread died".into()))??;
        }
        Ok(EnginePool {
            engine,
            jobs: tx,
            slots,
            batch_sessions,
        })
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
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
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |engine, ctxs| {
            let _ = tx.send(f(engine, ctxs));
        });
        self.jobs
            .send(job)
            .map_err(|_| EngineError::Context("engine threads are gone".into()))?;
        rx.await
            .map_err(|_| EngineError::Context("engine thread panicked".into()))
    }
}
