//! Entity cards and foundation memories exactly as seed 001 builds them, so a prompt can
//! carry the few important facts about each person or project a hit mentions.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::memory::error::Result;
use crate::memory::search::{Hit, HitKind};
use crate::memory::store::entities;
use crate::memory::store::Scope;

/// One card: `[person:john]: fact1; fact2; fact3`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Card {
    pub entity_ref: String,
    pub facts: Vec<String>,
    pub memory_ids: Vec<i64>,
    pub text: String,
}

#[derive(sqlx::FromRow)]
struct CardRow {
    #[sqlx(rename = "ref")]
    entity_ref: String,
    id: i64,
    text: String,
    pinned: bool,
    importance: i16,
    created_at: DateTime<Utc>,
}

/// Cards for `refs` (in the given order). Merged spellings resolve to one card.
pub async fn cards_for_refs(
    pool: &PgPool,
    scope: &Scope,
    refs: Option<&[String]>,
) -> Result<Vec<Card>> {
    scope.validate()?;
    let aliases = entities::alias_map(pool, &scope.user_id).await?;
    let canon = |r: &str| aliases.get(r).cloned().unwrap_or_else(|| r.to_string());
    let wanted: Option<Vec<String>> = refs.map(|rs| {
        let mut all: Vec<String> = Vec::new();
        for r in rs {
            let c = canon(r);
            for (a, to) in &aliases {
                if *to == c && !all.contains(a) {
                    all.push(a.clone());
                }
            }
            if !all.contains(&c) {
                all.push(c);
            }
        }
        all
    });
    let rows = sqlx::query_as::<_, CardRow>(include_str!("../../../sql/memory/cards.sql"))
        .bind(&scope.user_id)
        .bind(scope.character_id)
        .bind(&scope.guild_id)
        .bind(&wanted)
        .fetch_all(pool)
        .await?;
    let mut groups: HashMap<String, Vec<CardRow>> = HashMap::new();
    for row in rows {
        groups.entry(canon(&row.entity_ref)).or_default().push(row);
    }
    let order: Vec<String> = match refs {
        Some(rs) => {
            let mut o: Vec<String> = Vec::new();
            for r in rs {
                let c = canon(r);
                if !o.contains(&c) {
                    o.push(c);
                }
            }
            o
        }
        None => {
            let mut o: Vec<String> = groups.keys().cloned().collect();
            o.sort();
            o
        }
    };
    let mut out = Vec::new();
    for r in order {
        let Some(mut g) = groups.remove(&r) else {
            continue;
        };
        g.sort_by(|a, b| {
            b.pinned
                .cmp(&a.pinned)
                .then(b.importance.cmp(&a.importance))
                .then(b.created_at.cmp(&a.created_at))
                .then(b.id.cmp(&a.id))
        });
        g.dedup_by_key(|x| x.id);
        g.truncate(3);
        let facts: Vec<String> = g.iter().map(|x| x.text.clone()).collect();
        out.push(Card {
            text: format!("[{}]: {}", r, facts.join("; ")),
            entity_ref: r,
            memory_ids: g.iter().map(|x| x.id).collect(),
            facts,
        });
    }
    Ok(out)
}

/// Cards for the refs of a search's memory hits, in hit order.
pub async fn cards_for_hits(pool: &PgPool, scope: &Scope, hits: &[Hit]) -> Result<Vec<Card>> {
    let mut refs: Vec<String> = Vec::new();
    for h in hits.iter().filter(|h| h.kind == HitKind::Memory) {
        for r in &h.entity_refs {
            if !refs.contains(r) {
                refs.push(r.clone());
            }
        }
    }
    if refs.is_empty() {
        return Ok(Vec::new());
    }
    cards_for_refs(pool, scope, Some(&refs)).await
}

/// A foundation memory (pinned).
#[derive(Debug, Clone, Serialize, PartialEq, sqlx::FromRow)]
pub struct Foundation {
    pub id: i64,
    pub text: String,
    pub entity_refs: Vec<String>,
}

/// Seed 001's foundation memories: the pinned facts, up to 20.
pub async fn foundation(pool: &PgPool, scope: &Scope) -> Result<Vec<Foundation>> {
    scope.validate()?;
    Ok(
        sqlx::query_as::<_, Foundation>(include_str!("../../../sql/memory/foundation.sql"))
            .bind(&scope.user_id)
            .bind(scope.character_id)
            .bind(&scope.guild_id)
            .fetch_all(pool)
            .await?,
    )
}
