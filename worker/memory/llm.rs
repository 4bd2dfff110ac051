//! The memory lane's LLM extractor: seed 002's grammar-constrained extraction and filters
//! ([`super::extract`]) behind the [`Extractor`] seam the jobs call. A llama.cpp context
//! cannot move between threads, so one thread owns it and extractions queue for it.

use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};

use super::extract::{self, FactCandidate};
use super::{ExtractedFact, Extractor};
use crate::engine::{Busy, Engine, EngineParams};

type Reply = std::result::Result<Vec<ExtractedFact>, String>;

/// Work for the model's thread.
enum Job {
    Extract(String, String, mpsc::Sender<Reply>),
    About(
        String,
        String,
        mpsc::Sender<std::result::Result<String, String>>,
    ),
}

/// An extraction model on its own thread.
pub struct LlmExtractor {
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl LlmExtractor {
    /// Loads the extraction model (seed 002's `memoryLlm`: configurable apart from the chat
    /// model) and starts its thread.
    pub fn load(
        path: &Path,
        params: EngineParams,
        busy: Option<Busy>,
    ) -> Result<LlmExtractor, String> {
        let engine = Engine::load(path, None, params).map_err(|e| e.to_string())?;
        LlmExtractor::start(Arc::new(engine), busy)
    }

    /// Starts the thread on an engine already loaded (the chat model's weights, with a
    /// context of the thread's own). It pauses between decode steps while `busy` is true.
    pub fn start(engine: Arc<Engine>, busy: Option<Busy>) -> Result<LlmExtractor, String> {
        let extractor = extract::Extractor::new(engine).yielding(busy);
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("kvmem-extract".into())
            .spawn(move || {
                let mut ctx = match extractor.new_context() {
                    Ok(ctx) => {
                        let _ = ready_tx.send(Ok(()));
                        ctx
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                for job in rx {
                    match job {
                        Job::Extract(speaker, text, reply) => {
                            let result = extractor
                                .extract(&mut ctx, &speaker, &text)
                                .map(|ex| ex.facts.into_iter().map(stored_form).collect())
                                .map_err(|e| e.to_string());
                            let _ = reply.send(result);
                        }
                        Job::About(name, said, reply) => {
                            let result = extractor
                                .summarize_about(&mut ctx, &name, &said)
                                .map_err(|e| e.to_string());
                            let _ = reply.send(result);
                        }
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        ready_rx
            .recv()
            .map_err(|_| "extraction thread died".to_string())??;
        Ok(LlmExtractor {
            jobs: Mutex::new(tx),
        })
    }
}

impl LlmExtractor {
    /// Hands `job` to the model's thread and waits for its answer.
    fn ask<T>(
        &self,
        job: impl FnOnce(mpsc::Sender<Result<T, String>>) -> Job,
    ) -> Result<T, String> {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .lock()
            .map_err(|_| "extraction queue poisoned".to_string())?
            .send(job(tx))
            .map_err(|_| "extraction thread is gone".to_string())?;
        rx.recv()
            .map_err(|_| "extraction thread stopped".to_string())?
    }
}

impl Extractor for LlmExtractor {
    fn extract(&self, speaker: &str, text: &str) -> Reply {
        self.ask(|tx| Job::Extract(speaker.to_string(), text.to_string(), tx))
    }

    fn summarize_about(&self, name: &str, said: &str) -> Result<String, String> {
        self.ask(|tx| Job::About(name.to_string(), said.to_string(), tx))
    }
}

/// A filtered candidate as the store takes it.
fn stored_form(c: FactCandidate) -> ExtractedFact {
    ExtractedFact {
        text: c.text,
        fact_type: c.fact_type,
        kind: c.kind,
        entity_refs: c.entity_refs,
        entity_label: c.entity_label,
        importance: Some(c.importance),
        confidence: Some(c.confidence),
        evidence_text: c.evidence,
    }
}
