//! Engine threads, each owning one llama.cpp context: a context cannot move between
//! threads, and llama.cpp work must never block the tokio runtime.

use std::sync::{mpsc, Arc, Mutex};

use llama_cpp_2::context::LlamaContext;

use super::{Engine, EngineError};

type Job = Box<dyn FnOnce(&Engine, &mut LlamaContext<'static>) + Send>;

/// Engine threads, each owning one llama.cpp context. Jobs never run on the tokio runtime.
pub struct EnginePool {
    engine: Arc<Engine>,
    jobs: mpsc::Sender<Job>,
}

impl EnginePool {
    /// Starts `slots` threads and creates their contexts; fails if any context cannot be made.
    pub fn start(engine: Arc<Engine>, slots: u32) -> Result<EnginePool, EngineError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for slot in 0..slots {
            let (engine, rx) = (engine.clone(), rx.clone());
            let (ready_tx, ready_rx) = mpsc::channel();
            std::thread::Builder::new()
                .name(format!("kvmem-engine-{slot}"))
                .spawn(move || {
                    let mut ctx = match engine.new_context() {
                        Ok(ctx) => {
                            let _ = ready_tx.send(Ok(()));
                            ctx
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
                            Ok(job) => job(&engine, &mut ctx),
                            Err(_) => return,
                        }
                    }
                })
                .map_err(|e| EngineError::Context(e.to_string()))?;
            ready_rx
                .recv()
                .map_err(|_| EngineError::Context("engine thread died".into()))??;
        }
        Ok(EnginePool { engine, jobs: tx })
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Runs `f` on an engine thread and awaits its result.
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine, &mut LlamaContext<'static>) -> R + Send + 'static,
    ) -> Result<R, EngineError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |engine, ctx| {
            let _ = tx.send(f(engine, ctx));
        });
        self.jobs
            .send(job)
            .map_err(|_| EngineError::Context("engine threads are gone".into()))?;
        rx.await
            .map_err(|_| EngineError::Context("engine thread panicked".into()))
    }
}
