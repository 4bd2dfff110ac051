//! Entity refs and their aliases apart from the fact store, because resolving spellings
//! (slugs, merges of near-identical names) is its own job that the store, the cards and
//! the CLI all call on.

use std::collections::HashMap;

use serde::Serialize;
use sqlx::PgPool;

use crate::memory::error::{MemoryError, Result};

/// Seed 001's slug rules: lowercase, punctuation removed, spaces and hyphens become `_`.
pub fn slug(name: &str) -> String {
    let mut out = String::new();
    for c in name.trim().chars() {
        if c == ' ' || c == '-' || c == '_' || c.is_whitespace() {
            if !out.ends_with('_') && !out.is_empty() {
                out.push('_');
            }
        } else if c.is_alphanumeric() {
            out.extend(c.to_lowercase());
        }
    }
    out.trim_end_matches('_').to_string()
}

/// `<type>:<slug>`, or an error naming what is wrong with the ref.
pub fn entity_ref(raw: &str) -> Result<String> {
    let (t, name) = raw
        .split_once(':')
        .ok_or_else(|| MemoryError::Invalid(format!("entity ref {raw:?} is not <type>:<name>")))?;
    let t = slug(t);
    let s = slug(name);
    if t.is_empty() || s.is_empty() {
        return Err(MemoryError::Invalid(format!(
            "entity ref {raw:?} has an empty type or name"
        )));
    }
    Ok(format!("{t}:{s}"))
}

/// Maps merged spellings to their canonical ref (entity resolution).
pub async fn resolve_refs(pool: &PgPool, user: &str, refs: &[String]) -> Result<Vec<String>> {
    if refs.is_empty() {
        return Ok(Vec::new());
    }
    let aliases = alias_map(pool, user).await?;
    let mut out: Vec<String> = Vec::new();
    for r in refs {
        let c = aliases.get(r).cloned().unwrap_or_else(|| r.clone());
        if !out.contains(&c) {
            out.push(c);
        }
    }
    Ok(out)
}

/// Alias ref to canonical ref, for one user.
pub async fn alias_map(pool: &PgPool, user: &str) -> Result<HashMap<String, String>> {
    let rows: Vec<(String, String)> =
        sqlx::query_as(include_str!("../../../sql/memory/aliases.sql"))
            .bind(user)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().collect())
}

/// A proposed merge of two near-identical entity slugs of one user.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MergeProposal {
    /// The spelling with more facts (ties: the first alphabetically).
    pub canonical: String,
    pub alias: String,
    pub similarity: f32,
}

#[derive(sqlx::FromRow)]
struct PairRow {
    a_ref: String,
    a_n: i64,
    b_ref: String,
    b_n: i64,
    sim: f32,
}

/// pg_trgm proposes merges of near-identical slugs within one user's scope
/// ("makesh" / "mukesh" score 0.4 on the slug part).
pub async fn propose_merges(
    pool: &PgPool,
    user: &str,
    threshold: f32,
) -> Result<Vec<MergeProposal>> {
    let rows = sqlx::query_as::<_, PairRow>(include_str!("../../../sql/memory/propose_merges.sql"))
        .bind(user)
        .bind(threshold)
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let (canonical, alias) = if r.b_n > r.a_n {
                (r.b_ref, r.a_ref)
            } else {
                (r.a_ref, r.b_ref)
            };
            MergeProposal {
                canonical,
                alias,
                similarity: r.sim,
            }
        })
        .collect())
}

/// Records a merge: from now on `alias` resolves to `canonical` for this user.
pub async fn merge_entities(
    pool: &PgPool,
    user: &str,
    alias: &str,
    canonical: &str,
    similarity: Option<f32>,
) -> Result<()> {
    let (alias, canonical) = (entity_ref(alias)?, entity_ref(canonical)?);
    if alias == canonical {
        return Err(MemoryError::Invalid(
            "cannot merge an entity into itself".into(),
        ));
    }
    sqlx::query(include_str!("../../../sql/memory/merge_alias.sql"))
        .bind(user)
        .bind(&alias)
        .bind(&canonical)
        .bind(similarity)
        .execute(pool)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_follow_seed_001() {
        assert_eq!(slug("John Doe"), "john_doe");
        assert_eq!(slug("Austin, Texas"), "austin_texas");
        assert_eq!(slug("Dashboard-Redesign!"), "dashboard_redesign");
        assert_eq!(slug("  Acme  Corp. "), "acme_corp");
        assert_eq!(entity_ref("Person:John Doe").unwrap(), "person:john_doe");
        assert!(entity_ref("john").is_err());
        assert!(entity_ref("person:!!").is_err());
    }
}
