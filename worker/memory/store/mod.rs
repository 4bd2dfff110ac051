//! The fact store: typed memories with entity refs and keys, written so that a repeated
//! fact updates its row, a contradicting fact becomes a new version with the old one kept
//! as history, and concurrent writers of one key can neither lose a write nor race.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

use super::embed;
use super::error::{MemoryError, Result};

pub mod entities;
pub mod filters;

/// Entity refs and aliases live in their own file; their paths here still work.
pub use entities::{
    alias_map, entity_ref, merge_entities, propose_merges, resolve_refs, slug, MergeProposal,
};

/// Seed 001's memory types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Kind {
    Profile,
    People,
    Project,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Profile => "PROFILE",
            Kind::People => "PEOPLE",
            Kind::Project => "PROJECT",
        }
    }
    pub fn parse(s: &str) -> Result<Kind> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PROFILE" => Ok(Kind::Profile),
            "PEOPLE" => Ok(Kind::People),
            "PROJECT" => Ok(Kind::Project),
            o => Err(MemoryError::Invalid(format!(
                "kind {o:?} is not PROFILE, PEOPLE or PROJECT"
            ))),
        }
    }
}

/// Seed 002's fact types, plus `lore`: one type for the filters and the store.
pub use filters::FactType;

/// Where a memory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Extraction,
    Explicit,
    SeededProfile,
    CuratedFold,
    Import,
    Lore,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Extraction => "extraction",
            Source::Explicit => "explicit",
            Source::SeededProfile => "seeded_profile",
            Source::CuratedFold => "curated_fold",
            Source::Import => "import",
            Source::Lore => "lore",
        }
    }
}

/// Lowercased, whitespace-collapsed, trailing punctuation dropped: what "the same fact"
/// means for dedup.
pub fn normalise_text(s: &str) -> String {
    let collapsed = s.split_whitespace().collect::<Vec<_>>().join(" ");
    collapsed
        .trim_end_matches(['.', '!', '?', ';', ','])
        .to_lowercase()
}

/// Seed 001's key `${type}|${entityType}|${primaryRef}|${factType}`. A fact with no entity
/// would make every such fact one key and each new one would supersede the last, so
/// ref-less facts are keyed by their normalised text (dedup without false supersession).
pub fn memory_key(kind: Kind, refs: &[String], fact_type: FactType, text: &str) -> String {
    match refs.first() {
        Some(r) => {
            let (t, s) = r.split_once(':').unwrap_or(("entity", r));
            format!(
                "{}|{}|{}|{}",
                kind.as_str().to_lowercase(),
                t,
                s,
                fact_type.as_str()
            )
        }
        None => {
            use sha2::{Digest, Sha256};
            let h = Sha256::digest(normalise_text(text).as_bytes());
            format!(
                "{}|self|text_{}|{}",
                kind.as_str().to_lowercase(),
                &hex::encode(h)[..16],
                fact_type.as_str()
            )
        }
    }
}

/// A fact to write.
#[derive(Debug, Clone)]
pub struct NewMemory {
    pub user_id: String,
    pub character_id: Option<i64>,
    pub guild_id: Option<String>,
    pub channel_id: Option<String>,
    /// `user`, or a lore subject.
    pub subject: String,
    pub kind: Kind,
    pub fact_type: FactType,
    pub text: String,
    pub entity_refs: Vec<String>,
    pub entity_label: Option<String>,
    pub importance: i16,
    pub pinned: bool,
    /// Computed from kind, refs and fact type when `None`.
    pub memory_key: Option<String>,
    pub source: Source,
    pub confidence: f32,
    pub evidence_text: Option<String>,
    pub source_message_ids: Vec<String>,
    pub valid_from: DateTime<Utc>,
    pub embedding: Option<Vec<f32>>,
    pub embed_model: Option<String>,
}

impl NewMemory {
    /// A fact with seed defaults (importance 1, confidence 0.7, valid from now).
    pub fn new(user: &str, kind: Kind, fact_type: FactType, text: &str, source: Source) -> Self {
        NewMemory {
            user_id: user.to_string(),
            character_id: None,
            guild_id: None,
            channel_id: None,
            subject: if fact_type == FactType::Lore {
                "__lore__".into()
            } else {
                "user".into()
            },
            kind,
            fact_type,
            text: text.to_string(),
            entity_refs: Vec::new(),
            entity_label: None,
            importance: 1,
            pinned: false,
            memory_key: None,
            source,
            confidence: 0.7,
            evidence_text: None,
            source_message_ids: Vec::new(),
            valid_from: Utc::now(),
            embedding: None,
            embed_model: None,
        }
    }

    fn validate(&mut self) -> Result<()> {
        if self.user_id.trim().is_empty() {
            return Err(MemoryError::Invalid("user_id must not be empty".into()));
        }
        self.text = self.text.split_whitespace().collect::<Vec<_>>().join(" ");
        if self.text.chars().count() < 3 {
            return Err(MemoryError::Invalid(
                "memory text needs at least 3 characters".into(),
            ));
        }
        if self.text.chars().count() > 2000 {
            return Err(MemoryError::Invalid(
                "memory text is longer than 2000 characters".into(),
            ));
        }
        if !(0..=3).contains(&self.importance) {
            return Err(MemoryError::Invalid("importance must be 0..=3".into()));
        }
        if !(0.0..=1.0).contains(&self.confidence) {
            return Err(MemoryError::Invalid("confidence must be 0..=1".into()));
        }
        let refs: Result<Vec<String>> = self.entity_refs.iter().map(|r| entity_ref(r)).collect();
        self.entity_refs = refs?;
        if self.pinned {
            self.importance = 3;
        }
        Ok(())
    }

    /// The key this fact is stored under.
    pub fn key(&self) -> String {
        self.memory_key
            .clone()
            .unwrap_or_else(|| memory_key(self.kind, &self.entity_refs, self.fact_type, &self.text))
    }

    /// Seed 002 embeds the fact with its type and evidence.
    pub fn embed_text(&self) -> String {
        embed_text(
            self.fact_type.as_str(),
            &self.text,
            self.evidence_text.as_deref(),
        )
    }
}

pub fn embed_text(fact_type: &str, text: &str, evidence: Option<&str>) -> String {
    match evidence {
        Some(e) if !e.trim().is_empty() => format!("{fact_type}: {text} (evidence: {e})"),
        _ => format!("{fact_type}: {text}"),
    }
}

/// What an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Upserted {
    /// A new key.
    Inserted { id: i64 },
    /// The same fact again: provenance merged into the existing version.
    Merged { id: i64 },
    /// A new version of an existing key; the older versions are history.
    Versioned { id: i64, current: i64 },
}

impl Upserted {
    pub fn id(self) -> i64 {
        match self {
            Upserted::Inserted { id }
            | Upserted::Merged { id }
            | Upserted::Versioned { id, .. } => id,
        }
    }
}

/// Stores a fact under its key. In one transaction holding the key's advisory lock:
/// the same text merges into its version; another text becomes a new version; versions
/// are then re-chained by (valid_from, text), so the current row is the one with the
/// latest validity whatever order concurrent writers arrived in (deterministic), and no
/// write is lost (each is a version or merged into an identical one).
pub async fn upsert(pool: &PgPool, mut m: NewMemory) -> Result<Upserted> {
    m.validate()?;
    m.entity_refs = resolve_refs(pool, &m.user_id, &m.entity_refs).await?;
    let key = m.key();
    let lock_name = format!(
        "kvmem:memory:{}|{}|{}|{}",
        m.user_id,
        m.guild_id.as_deref().unwrap_or(""),
        m.character_id.unwrap_or(0),
        key
    );
    // Transaction scope: one key's versions (lock, read, write, re-chain).
    let mut tx = pool.begin().await?;
    sqlx::query(include_str!("../../../sql/memory/lock_key.sql"))
        .bind(&lock_name)
        .execute(&mut *tx)
        .await?;
    let versions: Vec<(i64, String, DateTime<Utc>)> =
        sqlx::query_as(include_str!("../../../sql/memory/key_versions.sql"))
            .bind(&m.user_id)
            .bind(&m.guild_id)
            .bind(m.character_id)
            .bind(&key)
            .fetch_all(&mut *tx)
            .await?;
    let norm = normalise_text(&m.text);
    // The neighbours the new version would sit between in validity order.
    let pos = versions
        .iter()
        .position(|(_, t, f)| (*f, t.as_str()) > (m.valid_from, m.text.as_str()))
        .unwrap_or(versions.len());
    let same = |i: usize| {
        versions
            .get(i)
            .filter(|(_, t, _)| normalise_text(t) == norm)
            .map(|(id, _, _)| *id)
    };
    let merge_into = pos.checked_sub(1).and_then(same).or_else(|| same(pos));
    let emb = m.embedding.as_deref().map(embed::to_bytes);
    let outcome = if let Some(id) = merge_into {
        merge(&mut tx, id, &m, &emb).await?;
        Upserted::Merged { id }
    } else {
        let id = insert(&mut tx, &m, &key, &emb).await?;
        if versions.is_empty() {
            Upserted::Inserted { id }
        } else {
            Upserted::Versioned { id, current: id }
        }
    };
    sqlx::query(include_str!("../../../sql/memory/relink.sql"))
        .bind(&m.user_id)
        .bind(&m.guild_id)
        .bind(m.character_id)
        .bind(&key)
        .execute(&mut *tx)
        .await?;
    let current: i64 = sqlx::query_scalar(include_str!("../../../sql/memory/reopen.sql"))
        .bind(&m.user_id)
        .bind(&m.guild_id)
        .bind(m.character_id)
        .bind(&key)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(match outcome {
        Upserted::Versioned { id, .. } => Upserted::Versioned { id, current },
        o => o,
    })
}

/// The same fact again: its provenance joins the version `id`.
async fn merge(tx: &mut PgConnection, id: i64, m: &NewMemory, emb: &Option<Vec<u8>>) -> Result<()> {
    sqlx::query(include_str!("../../../sql/memory/merge.sql"))
        .bind(id)
        .bind(m.confidence)
        .bind(m.importance)
        .bind(m.pinned)
        .bind(&m.source_message_ids)
        .bind(&m.evidence_text)
        .bind(m.valid_from)
        .bind(emb)
        .bind(&m.embed_model)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// A new version of `key`; returns its id.
async fn insert(
    tx: &mut PgConnection,
    m: &NewMemory,
    key: &str,
    emb: &Option<Vec<u8>>,
) -> Result<i64> {
    let subtype = serde_json::json!({
        "entityType": m.entity_refs.first().and_then(|r| r.split_once(':')).map(|(t, _)| t),
        "factType": m.fact_type.as_str(),
    });
    let id: i64 = sqlx::query_scalar(include_str!("../../../sql/memory/insert.sql"))
        .bind(&m.user_id)
        .bind(m.character_id)
        .bind(&m.guild_id)
        .bind(&m.channel_id)
        .bind(&m.subject)
        .bind(m.kind.as_str())
        .bind(m.fact_type.as_str())
        .bind(&m.text)
        .bind(&m.entity_refs)
        .bind(&m.entity_label)
        .bind(subtype)
        .bind(m.importance)
        .bind(m.pinned)
        .bind(key)
        .bind(m.source.as_str())
        .bind(m.confidence)
        .bind(&m.evidence_text)
        .bind(&m.source_message_ids)
        .bind(m.valid_from)
        .bind(emb)
        .bind(&m.embed_model)
        .fetch_one(&mut *tx)
        .await?;
    Ok(id)
}

/// Seed 002's keep-80 per user and keep-120 per lore subject; soft; pinned never.
pub async fn archive_keep(
    pool: &PgPool,
    user: &str,
    keep_user: i64,
    keep_lore: i64,
) -> Result<u64> {
    let ids: Vec<i64> = sqlx::query_scalar(include_str!("../../../sql/memory/archive_keep.sql"))
        .bind(user)
        .bind(keep_user)
        .bind(keep_lore)
        .fetch_all(pool)
        .await?;
    Ok(ids.len() as u64)
}

/// Soft-archives facts of one user by id; returns the ids actually archived.
pub async fn archive_ids(pool: &PgPool, user: &str, ids: &[i64]) -> Result<Vec<i64>> {
    Ok(
        sqlx::query_scalar(include_str!("../../../sql/memory/archive_ids.sql"))
            .bind(user)
            .bind(ids)
            .fetch_all(pool)
            .await?,
    )
}

/// A stored memory as retrieval and the views see it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Memory {
    pub id: i64,
    pub user_id: String,
    pub character_id: Option<i64>,
    pub guild_id: Option<String>,
    pub channel_id: Option<String>,
    pub subject: String,
    pub kind: String,
    pub fact_type: String,
    pub text: String,
    pub entity_refs: Vec<String>,
    pub entity_label: Option<String>,
    pub importance: i16,
    pub pinned: bool,
    pub memory_key: String,
    pub source: String,
    pub status: String,
    pub confidence: f32,
    pub evidence_text: Option<String>,
    pub source_message_ids: Vec<String>,
    pub valid_from: DateTime<Utc>,
    pub valid_to: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    #[serde(skip)]
    pub embedding: Option<Vec<u8>>,
    /// The model that made `embedding`.
    #[serde(skip)]
    pub embed_model: Option<String>,
}

impl Memory {
    /// The fact's vector when `model` made it: another model's vector is not comparable.
    pub fn vector_of(&self, model: Option<&str>) -> Option<&[u8]> {
        match (&self.embedding, model) {
            (Some(v), Some(m)) if self.embed_model.as_deref() == Some(m) => Some(v),
            _ => None,
        }
    }
}

/// Who is asking: the user is a wall, the character filters reads, the guild is a wall.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub user_id: String,
    pub character_id: Option<i64>,
    pub guild_id: Option<String>,
    /// A ranking hint only.
    pub channel_id: Option<String>,
}

impl Scope {
    pub fn user(user: &str) -> Scope {
        Scope {
            user_id: user.to_string(),
            ..Scope::default()
        }
    }
    pub fn validate(&self) -> Result<()> {
        if self.user_id.trim().is_empty() {
            return Err(MemoryError::Invalid("--user must not be empty".into()));
        }
        Ok(())
    }
}

/// The facts visible in `scope` (current, or valid at `as_of`), pinned and important first.
pub async fn facts(
    pool: &PgPool,
    scope: &Scope,
    as_of: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<Vec<Memory>> {
    scope.validate()?;
    Ok(
        sqlx::query_as::<_, Memory>(include_str!("../../../sql/memory/current_facts.sql"))
            .bind(&scope.user_id)
            .bind(scope.character_id)
            .bind(&scope.guild_id)
            .bind(as_of)
            .bind(limit)
            .fetch_all(pool)
            .await?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_seed_001() {
        let refs = vec!["person:john_doe".to_string()];
        assert_eq!(
            memory_key(Kind::People, &refs, FactType::Relationship, "x"),
            "people|person|john_doe|relationship"
        );
        let a = memory_key(Kind::Profile, &[], FactType::Preference, "Likes tea.");
        let b = memory_key(Kind::Profile, &[], FactType::Preference, "likes  TEA");
        let c = memory_key(Kind::Profile, &[], FactType::Preference, "likes coffee");
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
