//! The rankers as pure functions over scored candidates, so each formula can be checked
//! against hand-computed numbers and compared side by side on the same candidates.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::components::{Components, GATE_LEXICAL, GATE_SEMANTIC};
use super::types::{Hit, HitKind};
use crate::memory::ranker::RankerKind;

/// What every ranker may look at for one candidate. Lists (lexical, vector) are ranks
/// among all candidates, 0 = best; `None` = not in that list.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Signals {
    /// Rank in the BM25 list; list order for RRF.
    pub lexical_rank: Option<usize>,
    /// Seed 002's lexical score: share of the query's content words the text contains, 0..1.
    pub lexical: f64,
    /// Cosine with the query; `None` when there is no vector (model missing).
    pub semantic: Option<f64>,
    pub vector_rank: Option<usize>,
    pub confidence: f64,
    pub at: Option<DateTime<Utc>>,
    /// Seed 002's channel score: 1 same channel, 0.25 none, 0 another.
    pub channel: f64,
    /// Seed 001's entity frequency in the candidate set, 0..1.
    pub entity_freq: f64,
    /// Inside the query's time window (None = the query named no time).
    pub in_window: Option<bool>,
    /// Rank inside the time window list.
    pub window_rank: Option<usize>,
    /// Cosine of the best of the user's nearest spans this message sits in.
    pub span: Option<f64>,
    /// BM25 score as a share of the best BM25 score of the query, 0..1.
    pub bm25: f64,
    /// Cosine with the question in the named speaker's own voice; only that speaker's
    /// turns have one.
    pub voice: Option<f64>,
}

/// A score with its parts, for the JSON `components`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub score: f64,
    pub components: Components,
    /// Seed 002's relevance gate (other rankers: always true).
    pub passes_gate: bool,
}

fn age_days(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> f64 {
    at.map(|t| ((now - t).num_seconds() as f64 / 86_400.0).max(0.0))
        .unwrap_or(0.0)
}

/// 0.40 similarity + 0.30 recency (exponential, 14-day half-life) + 0.30 entity frequency
/// (the memory-record design's formula). Without a vector, similarity falls back to the
/// lexical score.
pub fn recency_importance(s: &Signals, now: DateTime<Utc>) -> Scored {
    let sim = s.semantic.unwrap_or(s.lexical).max(0.0);
    let recency = 0.5f64.powf(age_days(s.at, now) / 14.0);
    let score = 0.40 * sim + 0.30 * recency + 0.30 * s.entity_freq;
    Scored {
        score,
        components: Components {
            similarity: Some(sim),
            recency: Some(recency),
            entity_frequency: Some(s.entity_freq),
            ..Components::default()
        },
        passes_gate: true,
    }
}

/// The weighted formula of the dashboard-search design, or its no-semantic variant when
/// there is no vector, and its relevance gate. Gate without semantic (that design's
/// numbers): lexical >= 0.24 or combined >= 0.62. Gate with semantic (the design names no
/// numbers; kvmem's choice): semantic >= 0.30, or lexical >= 0.24, or combined >= 0.50
/// with semantic or lexical >= 0.15.
pub fn weighted(s: &Signals, now: DateTime<Utc>) -> Scored {
    let recency = 1.0 / (1.0 + age_days(s.at, now) / 45.0);
    let mut components = Components {
        lexical: Some(s.lexical),
        confidence: Some(s.confidence),
        recency: Some(recency),
        channel: Some(s.channel),
        ..Components::default()
    };
    let (score, gate) = match s.semantic {
        Some(sem) => {
            let sem = sem.max(0.0);
            components.semantic = Some(sem);
            let c = 0.50 * sem
                + 0.28 * s.lexical
                + 0.10 * s.confidence
                + 0.07 * recency
                + 0.05 * s.channel;
            let gate = sem >= GATE_SEMANTIC
                || s.lexical >= GATE_LEXICAL
                || (c >= 0.50 && sem.max(s.lexical) >= 0.15);
            (c, gate)
        }
        None => {
            let c = 0.75 * s.lexical + 0.10 * s.confidence + 0.10 * recency + 0.05 * s.channel;
            (c, s.lexical >= GATE_LEXICAL || c >= 0.62)
        }
    };
    Scored {
        score,
        components,
        passes_gate: gate,
    }
}

/// The hybrid's weights, fitted once on the tuning half of ops/memory-evalset with the
/// candidates of both packaged embedders (all-MiniLM-L6-v2 and multilingual-e5-small),
/// one set for both: coordinate ascent from the previous weights, then held to
/// leave-one-conversation-out (MiniLM 0.654, e5 0.639 R@10 there, against 0.669 and
/// 0.654 in sample). The cosines enter standardised over the query's own candidates
/// ([`Spread`]), so the weights do not depend on where a model's cosines sit.
pub const SEMANTIC_WEIGHT: f64 = 0.15;
/// The best span a message sits in: the question names an exchange's topic, the answer
/// sits in one of its turns.
pub const SPAN_WEIGHT: f64 = 0.3;
/// BM25's share of the query's best: a rare shared word (a name, a place) is evidence.
pub const BM25_WEIGHT: f64 = 0.25;
/// A time the question names is a hard clue: the window list's reciprocal rank, doubled.
pub const TIME_WEIGHT: f64 = 2.0;
/// The named speaker's turns, scored by the question in their voice (standardised like
/// the message's own cosine)...
pub const VOICE_WEIGHT: f64 = 0.38;
/// ...and a lift for being that speaker's turn at all.
pub const VOICED_WEIGHT: f64 = 0.85;
/// A missing cosine (no vector of the query's model, or no span) counts as two standard
/// deviations under the query's mean.
const MISSING_Z: f64 = -2.0;
/// Fewer candidates with a cosine than this, and their spread says little (three lines
/// a hundredth apart would be ±1 standard deviation): the hybrid then takes the raw
/// cosines with the weights fitted on MiniLM before ([`RAW`]). The evaluation's queries
/// all had 133 or more, so its figures are the standardised hybrid's.
pub const MIN_SPREAD_POOL: usize = 50;

/// The previous hybrid's weights, over raw cosines (fitted on MiniLM's scale).
pub struct RawWeights {
    pub semantic: f64,
    pub span: f64,
    pub bm25: f64,
    pub voice: f64,
}

/// Used when a query has too few candidates to standardise over ([`MIN_SPREAD_POOL`]).
pub const RAW: RawWeights = RawWeights {
    semantic: 1.0,
    span: 1.5,
    bm25: 0.1,
    voice: 0.8,
};
/// Reciprocal-rank fusion constant (the lexical-only ranker's list, and the time list).
pub const RRF_K: f64 = 10.0;

fn rrf(rank: Option<usize>) -> f64 {
    rank.map(|r| 1.0 / (RRF_K + r as f64 + 1.0)).unwrap_or(0.0)
}

/// Where one kind of cosine sits among a query's candidates. e5's cosines crowd into a
/// band a few hundredths wide (most candidates between 0.76 and 0.83) where MiniLM's
/// spread from 0 to 0.8: a raw cosine's weight would mean something else for each model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub sd: f64,
}

impl Spread {
    /// The mean and (population) standard deviation; a spread of nothing, or of one
    /// value, is 0 ± 1 so that a lone cosine is not divided by zero.
    pub fn of(xs: impl Iterator<Item = f64>) -> Spread {
        let xs: Vec<f64> = xs.collect();
        if xs.is_empty() {
            return Spread { mean: 0.0, sd: 1.0 };
        }
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
        Spread {
            mean,
            sd: if sd > 0.0 { sd } else { 1.0 },
        }
    }

    fn z(&self, x: Option<f64>, missing: f64) -> f64 {
        x.map_or(missing, |x| (x - self.mean) / self.sd)
    }
}

/// The spreads the hybrid standardises with: of the candidates' own cosines (the voice
/// cosine is the same question's, so it shares that spread) and of their spans'.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spreads {
    pub semantic: Spread,
    pub span: Spread,
}

impl Spreads {
    /// The candidates' spreads, or `None` when fewer than [`MIN_SPREAD_POOL`] of them have
    /// a cosine.
    pub fn of<'a>(signals: impl Iterator<Item = &'a Signals> + Clone) -> Option<Spreads> {
        let cosines = signals.clone().filter(|s| s.semantic.is_some()).count();
        (cosines >= MIN_SPREAD_POOL).then(|| Spreads {
            semantic: Spread::of(signals.clone().filter_map(|s| s.semantic)),
            span: Spread::of(signals.filter_map(|s| s.span)),
        })
    }
}

/// kvmem's default: a weighted sum of the message's own cosine, the best span it sits in
/// (both standardised over the query's candidates), its BM25 score as a share of the
/// query's best, its place in the time window list when the query names a time, and for
/// a speaker the question names, the cosine of the question in their voice. Scores, not
/// ranks: two cosines far apart stay far apart. The components are the raw signals (the
/// cosines as they are, 0 where there is none), not the weighted parts.
pub fn hybrid(s: &Signals, spreads: Option<&Spreads>) -> Scored {
    let time = TIME_WEIGHT * rrf(s.window_rank);
    let score = time
        + match spreads {
            Some(spreads) => {
                SEMANTIC_WEIGHT * spreads.semantic.z(s.semantic, MISSING_Z)
                    + SPAN_WEIGHT * spreads.span.z(s.span, MISSING_Z)
                    + BM25_WEIGHT * s.bm25
                    + s.voice.map_or(0.0, |v| {
                        VOICE_WEIGHT * spreads.semantic.z(Some(v), 0.0) + VOICED_WEIGHT
                    })
            }
            None => {
                RAW.semantic * s.semantic.unwrap_or(0.0)
                    + RAW.span * s.span.unwrap_or(0.0)
                    + RAW.bm25 * s.bm25
                    + RAW.voice * s.voice.unwrap_or(0.0)
            }
        };
    let components = Components {
        semantic: Some(s.semantic.unwrap_or(0.0)),
        span: Some(s.span.unwrap_or(0.0)),
        bm25: Some(s.bm25),
        lexical: Some(s.lexical),
        time: s.in_window.map(|_| time),
        voice: s.voice,
        ..Components::default()
    };
    Scored {
        score,
        components,
        passes_gate: true,
    }
}

/// Scores one candidate with the named ranker; the hybrid standardises its cosines with
/// `spreads`, those of the query's candidates ([`Spreads::of`]), when there are enough.
pub fn score(
    kind: RankerKind,
    s: &Signals,
    spreads: Option<&Spreads>,
    now: DateTime<Utc>,
) -> Scored {
    match kind {
        RankerKind::RecencyImportance => recency_importance(s, now),
        RankerKind::Weighted => weighted(s, now),
        RankerKind::Hybrid => hybrid(s, spreads),
        RankerKind::Lexical => Scored {
            score: rrf(s.lexical_rank),
            components: Components {
                rrf_lexical: Some(rrf(s.lexical_rank)),
                ..Components::default()
            },
            passes_gate: s.lexical_rank.is_some(),
        },
        RankerKind::Vector => {
            let sem = s.semantic.unwrap_or(f64::NEG_INFINITY);
            Scored {
                score: if sem.is_finite() { sem } else { -1.0 },
                components: Components {
                    semantic: Some(s.semantic.unwrap_or(0.0)),
                    ..Components::default()
                },
                passes_gate: s.semantic.is_some(),
            }
        }
    }
}

/// Scores every candidate with `kind` and keeps those it may return: with `strict`, only
/// those through its gate; the lexical and vector rankers only their own list's.
pub fn rank(
    kind: RankerKind,
    strict: bool,
    now: DateTime<Utc>,
    candidates: Vec<(Hit, Signals)>,
) -> Vec<Hit> {
    let spreads = Spreads::of(candidates.iter().map(|(_, s)| s));
    candidates
        .into_iter()
        .filter_map(|(mut hit, s)| {
            let scored = score(kind, &s, spreads.as_ref(), now);
            let own_list = match kind {
                RankerKind::Lexical => s.lexical_rank.is_some(),
                RankerKind::Vector => s.vector_rank.is_some() || hit.kind == HitKind::Memory,
                _ => true,
            };
            if (strict && !scored.passes_gate) || !own_list {
                return None;
            }
            hit.score = scored.score;
            hit.components = scored.components;
            Some(hit)
        })
        .collect()
}

/// Seed 001's entity frequency: for each candidate, how often its most frequent entity
/// occurs across the candidate set, divided by the set's largest such count.
pub fn entity_frequency(entities: &[Vec<String>]) -> Vec<f64> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for es in entities {
        let mut seen: Vec<&str> = Vec::new();
        for e in es {
            if !seen.contains(&e.as_str()) {
                seen.push(e);
                *counts.entry(e).or_default() += 1;
            }
        }
    }
    let best = entities
        .iter()
        .map(|es| es.iter().map(|e| counts[e.as_str()]).max().unwrap_or(0))
        .collect::<Vec<_>>();
    let max = best.iter().copied().max().unwrap_or(0);
    best.iter()
        .map(|&b| if max == 0 { 0.0 } else { b as f64 / max as f64 })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rankers_parse_by_name_and_by_their_old_spellings() {
        for (name, kind) in [
            ("hybrid", RankerKind::Hybrid),
            ("weighted", RankerKind::Weighted),
            ("recency-importance", RankerKind::RecencyImportance),
            ("lexical", RankerKind::Lexical),
            ("vector", RankerKind::Vector),
            (" Weighted ", RankerKind::Weighted),
            ("seed001", RankerKind::RecencyImportance),
            ("seed002", RankerKind::Weighted),
        ] {
            assert_eq!(RankerKind::parse(name).unwrap(), kind, "{name:?}");
        }
        for kind in [RankerKind::RecencyImportance, RankerKind::Weighted] {
            assert_eq!(RankerKind::parse(kind.as_str()).unwrap(), kind);
        }
        let err = RankerKind::parse("bm25").unwrap_err().to_string();
        assert!(err.contains("weighted") && !err.contains("seed"), "{err}");
    }
}
