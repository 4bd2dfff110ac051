//! The memory lane's LLM extractor: seed 002's grammar-constrained extraction and filters
//! ([`crate::memory::ingest::extract`]) behind the [`Extractor`] seam the jobs call. A llama.cpp context
//! cannot move between threads, so one thread owns it and extractions queue for it.

use std::sync::Arc;

use crate::engine::generate::WarmContext;
use crate::engine::threads::{EngineThreads, ModelStartError, RunError};
use crate::engine::{Busy, Engine, GenerateError};
use crate::memory::extractor::{ExtractError, ExtractedFact, Extractor};
use crate::memory::ingest::extract::{self, FactCandidate};

/// An extraction model on its own thread.
pub struct LlmExtractor {
    extractor: Arc<extract::Extractor>,
    thread: EngineThreads<WarmContext>,
}

impl LlmExtractor {
    /// Starts the thread on an engine already loaded (the chat model's weights, with a
    /// context of the thread's own). It pauses between decode steps while `busy` is true.
    pub fn start(engine: Arc<Engine>, busy: Option<Busy>) -> Result<LlmExtractor, ModelStartError> {
        let extractor = Arc::new(extract::Extractor::new(engine.clone()).yielding(busy));
        let maker = extractor.clone();
        let names = std::iter::once("kvmem-extract".to_string());
        let thread = EngineThreads::start(engine, names, move |_: &Engine| maker.new_context())
            .map_err(|e| e.for_model("extraction"))?;
        Ok(LlmExtractor { extractor, thread })
    }

    /// Runs `job` on the model's thread and waits for its answer.
    fn ask<T: Send + 'static>(
        &self,
        job: impl FnOnce(&extract::Extractor, &mut WarmContext) -> Result<T, GenerateError>
            + Send
            + 'static,
    ) -> Result<T, AskError> {
        let extractor = self.extractor.clone();
        let answer = self
            .thread
            .run_blocking(move |_, ctx| job(&extractor, ctx))
            .map_err(|e| match e {
                RunError::Gone => AskError::Gone,
                RunError::Stopped => AskError::Stopped,
            })?;
        answer.map_err(AskError::Model)
    }
}

/// Why an extraction job gave no answer: the thread is gone (never queued), it stopped
/// mid-job (the job panicked), or the model failed. The [`Extractor`] seam carries only
/// the text, which the job's result and the `memory_extract_error` event record.
#[derive(Debug, thiserror::Error)]
enum AskError {
    #[error("extraction thread is gone")]
    Gone,
    #[error("extraction thread stopped")]
    Stopped,
    #[error(transparent)]
    Model(GenerateError),
}

impl Extractor for LlmExtractor {
    fn extract(&self, speaker: &str, text: &str) -> Result<Vec<ExtractedFact>, ExtractError> {
        let (speaker, text) = (speaker.to_string(), text.to_string());
        self.ask(move |extractor, ctx| {
            extractor
                .extract(ctx, &speaker, &text)
                .map(|ex| ex.facts.into_iter().map(stored_form).collect())
        })
        .map_err(|e| ExtractError(e.to_string()))
    }

    fn summarize_about(&self, name: &str, said: &str) -> Result<String, ExtractError> {
        let (name, said) = (name.to_string(), said.to_string());
        self.ask(move |extractor, ctx| extractor.summarize_about(ctx, &name, &said))
            .map_err(|e| ExtractError(e.to_string()))
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
