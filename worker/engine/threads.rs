//! Threads that own llama.cpp contexts: a context cannot move between threads, so each
//! thread builds its own and runs jobs from one queue. The chat engine's pool, the
//! summariser and the extractor all run their models here.

use std::sync::{mpsc, Arc, Mutex};

use super::model::Engine;

type Job<S> = Box<dyn FnOnce(&Engine, &mut S) + Send>;

/// Why a background model (summaries, extraction) did not start: its file did not load,
/// or its thread could not be made or make its context.
#[derive(Debug, thiserror::Error)]
pub enum ModelStartError {
    #[error(transparent)]
    Load(#[from] super::error::EngineError),
    #[error("{0}")]
    Thread(String),
}

impl<E: std::fmt::Display> StartError<E> {
    /// As a [`ModelStartError`], naming the thread (`what`) when it died before answering.
    pub fn for_model(self, what: &str) -> ModelStartError {
        ModelStartError::Thread(match self {
            StartError::Spawn(e) => e.to_string(),
            StartError::Make(e) => e.to_string(),
            StartError::Died => format!("{what} thread died"),
        })
    }
}

/// Why the threads did not start.
#[derive(Debug)]
pub enum StartError<E> {
    /// The OS gave no thread.
    Spawn(std::io::Error),
    /// A thread could not build its state.
    Make(E),
    /// A thread ended before it said whether its state was built (its constructor
    /// panicked).
    Died,
}

/// Why a job has no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunError {
    /// Every thread has ended: the job was never queued.
    Gone,
    /// The thread ended without answering (the job panicked).
    Stopped,
}

/// Threads sharing one engine and one job queue, each with a state `S` of its own (its
/// contexts) that never leaves it. A job runs on whichever thread is free.
pub struct EngineThreads<S> {
    engine: Arc<Engine>,
    jobs: mpsc::Sender<Job<S>>,
}

impl<S: 'static> EngineThreads<S> {
    /// Starts one thread per name, one after the other; each builds its state with `make`
    /// and says so before the next starts. Fails with the first thread that cannot (the
    /// ones already started end with the returned queue).
    pub fn start<E: Send + 'static>(
        engine: Arc<Engine>,
        names: impl IntoIterator<Item = String>,
        make: impl Fn(&Engine) -> Result<S, E> + Send + Sync + 'static,
    ) -> Result<EngineThreads<S>, StartError<E>> {
        let (tx, rx) = mpsc::channel::<Job<S>>();
        // The threads hold the only handles on the queue: once all have ended, a job
        // cannot be queued, and the caller hears so instead of waiting forever.
        let rx = Arc::new(Mutex::new(rx));
        let make = Arc::new(make);
        for name in names {
            let (engine, rx, make) = (engine.clone(), rx.clone(), make.clone());
            let (ready_tx, ready_rx) = mpsc::channel();
            std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    let mut state = match make(&engine) {
                        Ok(state) => {
                            let _ = ready_tx.send(Ok(()));
                            state
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
                            Ok(job) => job(&engine, &mut state),
                            Err(_) => return,
                        }
                    }
                })
                .map_err(StartError::Spawn)?;
            ready_rx
                .recv()
                .map_err(|_| StartError::Died)?
                .map_err(StartError::Make)?;
        }
        Ok(EngineThreads { engine, jobs: tx })
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Runs `f` on a free thread and awaits its result.
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine, &mut S) -> R + Send + 'static,
    ) -> Result<R, RunError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.queue(Box::new(move |engine, state| {
            let _ = tx.send(f(engine, state));
        }))?;
        rx.await.map_err(|_| RunError::Stopped)
    }

    /// [`EngineThreads::run`] for blocking code. It blocks on a plain channel, so it may
    /// also be called on a runtime thread (which it then holds until the job is done).
    pub fn run_blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine, &mut S) -> R + Send + 'static,
    ) -> Result<R, RunError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.queue(Box::new(move |engine, state| {
            let _ = tx.send(f(engine, state));
        }))?;
        rx.recv().map_err(|_| RunError::Stopped)
    }

    fn queue(&self, job: Job<S>) -> Result<(), RunError> {
        self.jobs.send(job).map_err(|_| RunError::Gone)
    }
}
