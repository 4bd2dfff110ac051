//! The parts of a hit's score, typed: each ranker fills its own, the search JSON shows them
//! as `components` (only those a ranker filled, in name order), and recall's relevance
//! gate reads them here, beside the thresholds the rankers share.

use serde::Serialize;

/// The share of the query's content words in a line from which it is about the query: the
/// weighted ranker's lexical gate, and recall's gate for a line the embedder does not pass.
pub const GATE_LEXICAL: f64 = 0.24;
/// The weighted ranker's semantic gate (the design names none; kvmem's choice, MiniLM's
/// scale). Recall's gate takes the embedder's own related cosine instead.
pub const GATE_SEMANTIC: f64 = 0.30;

/// One hit's score parts. Fields are in name order, as the JSON has always listed them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Components {
    /// BM25's share of the query's best (hybrid).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bm25: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity_frequency: Option<f64>,
    /// The share of the query's content words the text holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lexical: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recency: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rrf_lexical: Option<f64>,
    /// The text's own cosine with the query.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub semantic: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub similarity: Option<f64>,
    /// The best span the message sits in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub span: Option<f64>,
    /// The time window's part, when the query names a time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<f64>,
    /// The question in the named speaker's voice, for that speaker's turns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voice: Option<f64>,
}

impl Components {
    /// About the query by its words alone: [`GATE_LEXICAL`] of them, or a place in the
    /// time the query names.
    pub fn about_by_words(&self) -> bool {
        self.lexical.unwrap_or(0.0) >= GATE_LEXICAL || self.time.unwrap_or(0.0) > 0.0
    }

    /// Recall's relevance gate: about the query by its words, or by `cosine` (the line's
    /// own, embedded alone; `None` takes the search's cosine) of at least `related`, the
    /// embedder's related cosine.
    pub fn about(&self, cosine: Option<f64>, related: f64) -> bool {
        self.about_by_words() || cosine.or(self.semantic).unwrap_or(0.0) >= related
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The JSON is what it was when components were a map from name to value: the same
    /// keys, in the same order, only those a ranker filled.
    #[test]
    fn serializes_as_the_name_ordered_map_it_replaced() {
        let typed = Components {
            voice: Some(0.5),
            semantic: Some(0.8),
            bm25: Some(0.25),
            time: Some(2.0),
            span: Some(0.6),
            lexical: Some(1.0 / 3.0),
            ..Components::default()
        };
        let map = BTreeMap::from([
            ("voice", 0.5),
            ("semantic", 0.8),
            ("bm25", 0.25),
            ("time", 2.0),
            ("span", 0.6),
            ("lexical", 1.0 / 3.0),
        ]);
        assert_eq!(
            serde_json::to_string(&typed).unwrap(),
            serde_json::to_string(&map).unwrap()
        );
        let every = Components {
            bm25: Some(1.0),
            channel: Some(2.0),
            confidence: Some(3.0),
            entity_frequency: Some(4.0),
            lexical: Some(5.0),
            recency: Some(6.0),
            rrf_lexical: Some(7.0),
            semantic: Some(8.0),
            similarity: Some(9.0),
            span: Some(10.0),
            time: Some(11.0),
            voice: Some(12.0),
        };
        let all = BTreeMap::from([
            ("bm25", 1.0),
            ("channel", 2.0),
            ("confidence", 3.0),
            ("entity_frequency", 4.0),
            ("lexical", 5.0),
            ("recency", 6.0),
            ("rrf_lexical", 7.0),
            ("semantic", 8.0),
            ("similarity", 9.0),
            ("span", 10.0),
            ("time", 11.0),
            ("voice", 12.0),
        ]);
        assert_eq!(
            serde_json::to_string(&every).unwrap(),
            serde_json::to_string(&all).unwrap()
        );
        assert_eq!(serde_json::to_string(&Components::default()).unwrap(), "{}");
    }

    #[test]
    fn the_gate_passes_by_words_time_or_cosine() {
        let c = |lexical: f64, time: Option<f64>, semantic: f64| Components {
            lexical: Some(lexical),
            time,
            semantic: Some(semantic),
            ..Components::default()
        };
        assert!(c(0.24, None, 0.0).about(Some(0.0), 0.3));
        assert!(!c(0.23, None, 0.0).about(Some(0.29), 0.3));
        assert!(c(0.0, Some(0.5), 0.0).about(Some(0.0), 0.3));
        assert!(c(0.0, None, 0.0).about(Some(0.3), 0.3));
        // Without a lone cosine, the search's own decides.
        assert!(c(0.0, None, 0.31).about(None, 0.3));
        assert!(!c(0.0, None, 0.29).about(None, 0.3));
    }
}
