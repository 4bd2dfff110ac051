//! The settings that name one of a few choices, as enums, so a misspelt choice stops
//! start-up with the allowed names instead of failing later in the service that reads it.

use serde::{Deserialize, Deserializer, Serialize};

/// KV cache element type; recorded in every snapshot header.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    F16,
    Q8_0,
    F32,
}

impl KvType {
    /// The name written into LLKV1 headers and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::F32 => "f32",
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Plain,
    Json,
}

/// What the chat endpoint does with a request's system message (`http.system_message`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SystemMessage {
    /// The character's stored persona stands; a front-end's generic system prompt ("You
    /// are a helpful assistant") never overwrites it.
    #[default]
    Ignore,
    /// The system message becomes the character's persona, as an edit of it would.
    Persona,
}

/// Where `kvmem serve` takes a request's user from (`http.identity`,
/// docs/http-api.md#identity).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum IdentityMode {
    /// The caller is a trusted backend: the body's or query's `user`, or the
    /// `http.user_header` header; sources that disagree are refused.
    #[default]
    Request,
    /// A trusted proxy sets `http.user_header`, the only source; another `user` is refused.
    Header,
    /// Per-user API keys (`kvmem keys create`): a key is its user; the service token
    /// still serves a backend under `request`'s rules.
    Key,
}

/// Where snapshots live.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotStoreKind {
    #[default]
    Local,
    S3,
}

/// The memory ranker `memory.ranker` names. The memory layer's `RankerKind` sits above
/// this module in the layering, so the settings keep their own list of names and the
/// memory layer maps each onto its ranker.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryRanker {
    #[default]
    Hybrid,
    Weighted,
    RecencyImportance,
    Lexical,
    Vector,
    /// The previous release's name of `recency-importance`. Kept as written, not folded
    /// into it here, because the memory layer warns about it, and settings are read before
    /// logging starts.
    Seed001,
    /// The previous release's name of `weighted`.
    Seed002,
}

/// Every ranker, so the names are read back from [`MemoryRanker::as_str`] alone.
const RANKERS: [MemoryRanker; 7] = [
    MemoryRanker::Hybrid,
    MemoryRanker::Weighted,
    MemoryRanker::RecencyImportance,
    MemoryRanker::Lexical,
    MemoryRanker::Vector,
    MemoryRanker::Seed001,
    MemoryRanker::Seed002,
];

impl MemoryRanker {
    /// The name as users write it.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryRanker::Hybrid => "hybrid",
            MemoryRanker::Weighted => "weighted",
            MemoryRanker::RecencyImportance => "recency-importance",
            MemoryRanker::Lexical => "lexical",
            MemoryRanker::Vector => "vector",
            MemoryRanker::Seed001 => "seed001",
            MemoryRanker::Seed002 => "seed002",
        }
    }
}

impl<'de> Deserialize<'de> for MemoryRanker {
    /// Case and surrounding spaces do not matter, as they did not when the setting was a
    /// string the memory layer parsed.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        let name = raw.trim().to_ascii_lowercase();
        RANKERS
            .into_iter()
            .find(|r| r.as_str() == name)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "unknown memory ranker {raw:?}, expected one of hybrid, weighted, \
                     recency-importance, lexical, vector"
                ))
            })
    }
}

/// Accepts `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`: seed 000 writes both
/// `KV_ONLY_ENABLED=true` and `KV_COMPRESS=1`.
pub(super) fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bool(bool),
        Int(i64),
        Str(String),
    }
    match Raw::deserialize(d)? {
        Raw::Bool(b) => Ok(b),
        Raw::Int(0) => Ok(false),
        Raw::Int(1) => Ok(true),
        Raw::Str(s) => match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            other => Err(serde::de::Error::custom(format!(
                "expected true/false or 1/0, found {other:?}"
            ))),
        },
        Raw::Int(n) => Err(serde::de::Error::custom(format!(
            "expected true/false or 1/0, found {n}"
        ))),
    }
}
