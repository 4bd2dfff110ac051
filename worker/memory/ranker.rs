//! The ranker a search uses is both a setting (the service's `MemoryConfig`) and a
//! request field (search's), so its name lives here, below the service and search both.

use serde::{Deserialize, Serialize};

use super::error::{MemoryError, Result};

/// The named rankers: two fixed weighted formulas and kvmem's fused default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RankerKind {
    /// 0.40 similarity, 0.30 recency (14-day half-life), 0.30 entity frequency.
    #[serde(rename = "recency-importance", alias = "seed001")]
    RecencyImportance,
    /// 0.50 semantic, 0.28 lexical, 0.10 confidence, 0.07 recency, 0.05 channel, with a
    /// relevance gate.
    #[serde(rename = "weighted", alias = "seed002")]
    Weighted,
    /// Reciprocal-rank fusion of lexical, vector and time-window lists.
    #[default]
    Hybrid,
    /// Postgres full-text rank only (for the benchmark's side-by-side).
    Lexical,
    /// MiniLM cosine only (for the benchmark's side-by-side).
    Vector,
}

impl RankerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RankerKind::RecencyImportance => "recency-importance",
            RankerKind::Weighted => "weighted",
            RankerKind::Hybrid => "hybrid",
            RankerKind::Lexical => "lexical",
            RankerKind::Vector => "vector",
        }
    }

    /// Parses a ranker's name. The spellings of the previous release (`seed001`,
    /// `seed002`, named after the documents they came from) still parse, with a warning.
    pub fn parse(s: &str) -> Result<RankerKind> {
        let name = s.trim().to_ascii_lowercase();
        let renamed = match name.as_str() {
            "seed001" => Some(RankerKind::RecencyImportance),
            "seed002" => Some(RankerKind::Weighted),
            _ => None,
        };
        if let Some(kind) = renamed {
            tracing::warn!(
                "ranker {name:?} is deprecated and will be removed in the next release: use {:?}",
                kind.as_str()
            );
            return Ok(kind);
        }
        match name.as_str() {
            "recency-importance" => Ok(RankerKind::RecencyImportance),
            "weighted" => Ok(RankerKind::Weighted),
            "hybrid" => Ok(RankerKind::Hybrid),
            "lexical" => Ok(RankerKind::Lexical),
            "vector" => Ok(RankerKind::Vector),
            other => Err(MemoryError::Invalid(format!(
                "unknown ranker {other:?} (hybrid, weighted, recency-importance, lexical, vector)"
            ))),
        }
    }
}

/// The setting's ranker, matched variant by variant so a ranker added to the settings' list
/// and not mapped here fails to compile; the previous release's names warn as [`RankerKind::parse`]
/// does.
impl From<crate::config::MemoryRanker> for RankerKind {
    fn from(r: crate::config::MemoryRanker) -> RankerKind {
        use crate::config::MemoryRanker as M;
        match r {
            M::Hybrid => RankerKind::Hybrid,
            M::Weighted => RankerKind::Weighted,
            M::RecencyImportance => RankerKind::RecencyImportance,
            M::Lexical => RankerKind::Lexical,
            M::Vector => RankerKind::Vector,
            M::Seed001 => deprecated(r, RankerKind::RecencyImportance),
            M::Seed002 => deprecated(r, RankerKind::Weighted),
        }
    }
}

fn deprecated(r: crate::config::MemoryRanker, kind: RankerKind) -> RankerKind {
    tracing::warn!(
        "ranker {:?} is deprecated and will be removed in the next release: use {:?}",
        r.as_str(),
        kind.as_str()
    );
    kind
}
