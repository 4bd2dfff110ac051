//! Seed 002's post-extraction filters: a small model invents, paraphrases and obeys
//! injected instructions, so every candidate fact is normalised, screened for
//! instruction-like text and secrets, and stored only if it is grounded in the message it
//! came from. Pure functions, so each rule is unit-tested on real-looking lines.
//!
//! Where seed 002 is vague this module picks, and the tests pin, the following:
//! - facts are 6..=200 characters after normalisation (shorter says nothing, longer is a
//!   paraphrased paragraph rather than a fact); evidence is at most 240;
//! - "system" and "developer" are rejected as roles (`system prompt`, `developer mode`,
//!   `system:`), not as words, so "Priya is a software developer" survives;
//! - grounding: the fact's compact form (lowercase, alphanumerics only) is a substring of
//!   the source's, or at least 45% of its content tokens (stop-words out, including the
//!   pronouns and "user" that third-person rewriting adds) appear in the source; with 3
//!   content tokens or fewer, all must appear. Beyond seed 002: names and numbers
//!   (capitalised after the first word, or containing a digit) must always appear, which
//!   stops "sister Priya is a doctor in Madrid" passing on 2 of 4 tokens;
//! - evidence is kept only when it is itself grounded; otherwise it is dropped and the
//!   fact stands or falls on its own grounding.

use std::fmt;

mod grounding;
mod normalise;
mod reason;
mod screening;
#[cfg(test)]
mod tests;

use grounding::compact;
pub use grounding::{
    has_negation, is_text_grounded_in_source, ungrounded_words, MIN_TOKEN_OVERLAP,
    SHORT_LINE_TOKENS,
};
pub use normalise::{clean_text, normalise_fact};
pub use reason::Reason;
pub use screening::screen;

/// Shortest fact kept, in characters, after normalisation.
pub const MIN_FACT_CHARS: usize = 6;
/// Longest fact kept, in characters, after normalisation.
pub const MAX_FACT_CHARS: usize = 200;
/// Longest evidence kept, in characters; longer evidence is dropped, not truncated.
pub const MAX_EVIDENCE_CHARS: usize = 240;

/// Errors of this module. Filtering itself never fails (every candidate gets a
/// [`Verdict`]); only the strict parse of a stored type name can.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("unknown fact type {0:?}")]
    UnknownFactType(String),
}

/// Seed 002's fact types, plus `lore` for the shared lore subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FactType {
    Preference,
    Profile,
    Relationship,
    Project,
    Other,
    Lore,
}

impl FactType {
    pub const ALL: [FactType; 6] = [
        FactType::Preference,
        FactType::Profile,
        FactType::Relationship,
        FactType::Project,
        FactType::Other,
        FactType::Lore,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FactType::Preference => "preference",
            FactType::Profile => "profile",
            FactType::Relationship => "relationship",
            FactType::Project => "project",
            FactType::Other => "other",
            FactType::Lore => "lore",
        }
    }

    /// Strict parse of a stored type name (case and spaces ignored; `general` is `other`).
    pub fn parse(s: &str) -> Result<FactType, FilterError> {
        let k = s.trim().to_ascii_lowercase();
        match k.as_str() {
            "general" => Ok(FactType::Other),
            _ => FactType::ALL
                .into_iter()
                .find(|t| t.as_str() == k)
                .ok_or_else(|| FilterError::UnknownFactType(s.to_string())),
        }
    }

    /// Lenient normalisation for model output: plurals and near-synonyms map to their type,
    /// anything unrecognised becomes `other` (a wrong label is no reason to lose a fact).
    pub fn normalise(s: &str) -> FactType {
        if let Ok(t) = FactType::parse(s) {
            return t;
        }
        let k = s.trim().to_ascii_lowercase();
        let k = k.trim_end_matches('s');
        match k {
            "preference" | "like" | "dislike" | "taste" => FactType::Preference,
            "profile" | "bio" | "biography" | "identity" | "personal" => FactType::Profile,
            "relationship" | "relation" | "family" | "friend" | "people" | "person" => {
                FactType::Relationship
            }
            "project" | "work" | "goal" | "task" => FactType::Project,
            _ => FactType::Other,
        }
    }
}

impl fmt::Display for FactType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A fact that passed every filter, normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanFact {
    pub text: String,
    pub fact_type: FactType,
    /// Normalised evidence, present only when it is itself grounded in the source.
    pub evidence: Option<String>,
    /// The model gave evidence that was ungrounded, instruction-like or too long.
    pub evidence_dropped: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Accepted(CleanFact),
    Rejected(Reason),
}

/// Rejections per filter for one message (or summed over many), plus dropped evidence and
/// model output that could not be parsed at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RejectCounts {
    pub empty: u32,
    pub too_short: u32,
    pub too_long: u32,
    pub instruction: u32,
    pub role_tag: u32,
    pub secret: u32,
    pub ungrounded: u32,
    pub duplicate: u32,
    pub over_cap: u32,
    pub subject: u32,
    pub negation_lost: u32,
    /// Messages the skip rule kept from the model (nothing to remember in them).
    pub skipped: u32,
    /// Evidence removed from an accepted fact (not a rejection of the fact).
    pub evidence_dropped: u32,
    /// Model outputs that did not deserialise (whole outputs, not facts).
    pub malformed: u32,
}

impl RejectCounts {
    pub fn record(&mut self, reason: &Reason) {
        let slot = match reason {
            Reason::Empty => &mut self.empty,
            Reason::TooShort => &mut self.too_short,
            Reason::TooLong => &mut self.too_long,
            Reason::Instruction { .. } => &mut self.instruction,
            Reason::RoleTag { .. } => &mut self.role_tag,
            Reason::Secret { .. } => &mut self.secret,
            Reason::Ungrounded => &mut self.ungrounded,
            Reason::Duplicate => &mut self.duplicate,
            Reason::OverCap => &mut self.over_cap,
            Reason::Subject => &mut self.subject,
            Reason::NegationLost => &mut self.negation_lost,
        };
        *slot += 1;
    }

    /// Facts rejected, over all filters (dropped evidence and malformed outputs excluded).
    pub fn rejected(&self) -> u32 {
        self.empty
            + self.too_short
            + self.too_long
            + self.instruction
            + self.role_tag
            + self.secret
            + self.ungrounded
            + self.duplicate
            + self.over_cap
            + self.subject
            + self.negation_lost
    }

    pub fn add(&mut self, o: &RejectCounts) {
        self.empty += o.empty;
        self.too_short += o.too_short;
        self.too_long += o.too_long;
        self.instruction += o.instruction;
        self.role_tag += o.role_tag;
        self.secret += o.secret;
        self.ungrounded += o.ungrounded;
        self.duplicate += o.duplicate;
        self.over_cap += o.over_cap;
        self.subject += o.subject;
        self.negation_lost += o.negation_lost;
        self.skipped += o.skipped;
        self.evidence_dropped += o.evidence_dropped;
        self.malformed += o.malformed;
    }
}

/// Runs every filter on one candidate. `source` is what the fact must be grounded in:
/// the message text (extraction passes `"<speaker>: <text>"` so the speaker's name counts).
pub fn check_fact(text: &str, fact_type: &str, evidence: Option<&str>, source: &str) -> Verdict {
    let fact = normalise_fact(text);
    let n = fact.chars().count();
    if compact(&fact).is_empty() {
        return Verdict::Rejected(Reason::Empty);
    }
    if n < MIN_FACT_CHARS {
        return Verdict::Rejected(Reason::TooShort);
    }
    if n > MAX_FACT_CHARS {
        return Verdict::Rejected(Reason::TooLong);
    }
    if let Some(r) = screen(&fact) {
        return Verdict::Rejected(r);
    }
    if !is_text_grounded_in_source(&fact, source) {
        return Verdict::Rejected(Reason::Ungrounded);
    }
    let (evidence, evidence_dropped) = match evidence.map(clean_text) {
        None => (None, false),
        Some(e) if compact(&e).is_empty() => (None, false),
        Some(e) => {
            let ok = e.chars().count() <= MAX_EVIDENCE_CHARS
                && screen(&e).is_none()
                && is_text_grounded_in_source(&e, source);
            if ok {
                (Some(e), false)
            } else {
                (None, true)
            }
        }
    };
    Verdict::Accepted(CleanFact {
        text: fact,
        fact_type: FactType::normalise(fact_type),
        evidence,
        evidence_dropped,
    })
}

/// Key two facts share when they say the same thing (case, punctuation and spacing aside).
pub fn dedup_key(fact: &str) -> String {
    compact(fact)
}
