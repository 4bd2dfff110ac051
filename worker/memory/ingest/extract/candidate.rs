//! What extraction makes of one message: its fact candidates (with their entity fields),
//! the outcome, and the slug entity names are written in.

use crate::memory::store::filters::{FactType, RejectCounts};
use crate::memory::store::Kind as MemoryKind;

/// Seed 002: at most 4 facts per message.
pub const MAX_FACTS: usize = 4;

/// A fact that passed the filters, with seed 001's entity fields.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FactCandidate {
    pub text: String,
    pub fact_type: FactType,
    pub kind: MemoryKind,
    /// `person`, `place`, `org` or `project`.
    pub entity_type: Option<String>,
    pub entity_label: Option<String>,
    /// `<type>:<slug>` keys, seed 001's slug rules.
    pub entity_refs: Vec<String>,
    /// 0..=3.
    pub importance: i16,
    /// 0.0..=1.0.
    pub confidence: f32,
    pub evidence: Option<String>,
}

/// The outcome for one message.
#[derive(Debug, Clone, Default)]
pub struct Extraction {
    pub facts: Vec<FactCandidate>,
    pub rejected: RejectCounts,
    /// The model's raw answer, for logs and the benchmark.
    pub raw: String,
    /// The answer hit the token budget; its last, cut-off line went through the filters
    /// like the others.
    pub truncated: bool,
    /// Why the model never saw the message ([`super::skip_reason`]), if it did not.
    pub skipped: Option<&'static str>,
    /// Candidates read off the message's own clauses ([`super::lines::clause_lines`]), judged
    /// by the same filters before the model's lines.
    pub rule_lines: Vec<String>,
}

/// Seed 001's slug: lowercase, punctuation removed, spaces and hyphens become `_`.
pub fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars().flat_map(char::to_lowercase) {
        if c.is_alphanumeric() {
            out.push(c);
        } else if (c.is_whitespace() || c == '-' || c == '_') && !out.ends_with('_') {
            out.push('_');
        }
    }
    out.trim_matches('_').to_string()
}
