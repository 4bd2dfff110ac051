//! What a search takes and gives: the request, the hits with their provenance and score
//! parts, the response, and how many candidates each leg brings.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::components::Components;
use super::timeq::TimeWindow;
use crate::memory::ranker::RankerKind;
use crate::memory::store::Scope;

/// Candidates taken from each retriever before ranking.
pub(super) const LEXICAL_CANDIDATES: i64 = 30;
pub(super) const VECTOR_CANDIDATES: usize = 100;
pub(super) const WINDOW_CANDIDATES: usize = 100;
/// Facts considered per query (one user's; keep-80 keeps this small).
pub(super) const FACT_CANDIDATES: i64 = 5000;

/// A search as the CLI and HTTP take it.
#[derive(Debug, Clone)]
pub struct SearchRequest {
    pub scope: Scope,
    pub query: String,
    pub limit: usize,
    pub as_of: Option<DateTime<Utc>>,
    pub ranker: RankerKind,
    /// Seed 002's strict mode: drop candidates that fail the relevance gate.
    pub strict: bool,
    /// Dialogue by this speaker is left out (a character's recall skips its own replies).
    pub skip_speaker: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HitKind {
    Memory,
    Message,
    Summary,
}

/// One ranked hit, with its provenance.
#[derive(Debug, Clone, Serialize)]
pub struct Hit {
    pub kind: HitKind,
    /// `memory:<id>` for facts; the caller's own message id for messages.
    pub id: String,
    pub text: String,
    pub score: f64,
    pub components: Components,
    /// The caller's message ids whose text this hit carries.
    pub source_message_ids: Vec<String>,
    pub session_id: Option<String>,
    pub speaker: Option<String>,
    pub at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub entity_refs: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SearchResponse {
    pub query: String,
    pub ranker: &'static str,
    pub as_of: Option<DateTime<Utc>>,
    /// False when no query vector could be made: scores are lexical only (seed 004).
    pub semantic: bool,
    /// The embedder the query's vector came from (its file's sha256 prefix); only vectors
    /// of the same model were compared with it.
    pub vector_model: Option<String>,
    /// The user's messages left out of the vector legs: no vector yet, or another model's
    /// (`kvmem memory reindex` embeds them). The lexical legs still search them.
    pub without_vector: i64,
    /// The user's current facts without a vector of the query's model: scored lexically
    /// until the memory lane (or a reindex) embeds them. A search never writes one.
    pub facts_without_vector: i64,
    pub time_window: Option<TimeWindow>,
    pub hits: Vec<Hit>,
    /// The query's vector, for callers that compare other text with it (recall's gate)
    /// without embedding the query again. Not part of the JSON.
    #[serde(skip)]
    pub query_vector: Option<Vec<f32>>,
}

pub(super) fn ranks<T: Copy + Eq + std::hash::Hash>(ordered: &[T]) -> HashMap<T, usize> {
    ordered.iter().enumerate().map(|(i, id)| (*id, i)).collect()
}
