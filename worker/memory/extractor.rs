//! The seam the extraction branch plugs into. The service holds an extractor and ingest
//! and notes call one, so the seam sits below all three rather than in ingest, which
//! itself runs on the service.

use serde::{Deserialize, Serialize};

use super::store;

/// A fact proposed by an extractor for one message (at most 4 are kept per message).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExtractedFact {
    pub text: String,
    pub fact_type: store::FactType,
    pub kind: store::Kind,
    /// `<type>:<name>`; the name is slugged on write.
    #[serde(default)]
    pub entity_refs: Vec<String>,
    #[serde(default)]
    pub entity_label: Option<String>,
    #[serde(default)]
    pub importance: Option<i16>,
    #[serde(default)]
    pub confidence: Option<f32>,
    #[serde(default)]
    pub evidence_text: Option<String>,
}

/// The seam the extraction branch plugs into: grammar-constrained LLM extraction and
/// seed 002's filters live behind it. Blocking: it runs on a blocking thread.
pub trait Extractor: Send + Sync {
    fn extract(
        &self,
        speaker: &str,
        text: &str,
    ) -> std::result::Result<Vec<ExtractedFact>, ExtractError>;

    /// Seed 004's "remember this about X": one third-person fact about `name` from what
    /// the user said (`said`). The caller checks it against `said` before storing it.
    fn summarize_about(&self, name: &str, said: &str) -> std::result::Result<String, ExtractError> {
        let _ = (name, said);
        Err(ExtractError("this extractor does not summarise".into()))
    }
}

/// Why an [`Extractor`] gave no answer: its model failed, or its thread stopped. The text
/// is what the job's result and the `memory_extract_error` event record.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ExtractError(pub String);
