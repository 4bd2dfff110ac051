//! The digest: a session's world-state facts as a short canonical text whose SHA-256 is
//! its version. Same facts, same text, same version, whatever the insert order, process
//! or clock: that is what lets a turn skip re-injecting a digest the KV already holds.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Row};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::context::tokens::TokenCount;
use crate::metrics::Metrics;

/// Channel the `facts` trigger notifies, payload = session id.
pub const FACTS_CHANNEL: &str = "kvmem_facts";

/// How a fact type is treated by the relevance gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Relevance {
    /// Conflicts, relationships, debts, quests, reputation, alliances, win/loss records:
    /// always in while active.
    Durable,
    /// Buffs, debuffs, alerts, rumors, timers: in only while unexpired.
    Ephemeral,
    /// Any other type: kept, but trimmed first when over budget.
    Unknown,
}

/// Classifies a fact type (case-insensitive, singular or plural).
pub fn relevance(fact_type: &str) -> Relevance {
    let t = fact_type.trim().to_ascii_lowercase();
    let t = t.strip_suffix('s').unwrap_or(&t);
    match t {
        "conflict" | "relationship" | "debt" | "quest" | "reputation" | "alliance" | "record"
        | "win_loss" | "win_loss_record" | "winloss" => Relevance::Durable,
        "buff" | "debuff" | "alert" | "rumor" | "timer" => Relevance::Ephemeral,
        _ => Relevance::Unknown,
    }
}

/// One active fact as read from the database.
#[derive(Debug, Clone)]
pub struct Fact {
    pub fact_type: String,
    pub value: String,
    pub expires_at: Option<DateTime<Utc>>,
}

/// A built digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub content: String,
    pub version: String,
    pub tokens: usize,
    pub fact_count: usize,
    pub next_expiry_at: Option<DateTime<Utc>>,
}

/// Collapses whitespace runs (newlines included) to one space and trims.
pub fn canonicalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `{Type}: {value}`, with the type's first letter capitalised and `_` read as a space.
pub fn render_line(fact_type: &str, value: &str) -> String {
    let t = canonicalize(&fact_type.replace('_', " "));
    let mut chars = t.chars();
    let label: String = match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    };
    canonicalize(&format!("{label}: {value}"))
}

/// SHA-256 of the canonical text, hex.
pub fn version_of(content: &str) -> String {
    hex::encode(Sha256::digest(content.as_bytes()))
}

/// Builds the digest from facts: gate, render, canonicalise, sort, trim to `max_tokens`
/// by priority (unknown types go first, then ephemeral, then durable; among equals the
/// last line in sort order goes first), hash. Timestamps and ids never enter the text.
pub fn build(facts: &[Fact], now: DateTime<Utc>, max_tokens: usize, tok: &dyn TokenCount) -> Built {
    let mut lines: Vec<(Relevance, String, Option<DateTime<Utc>>)> = facts
        .iter()
        .filter(|f| f.expires_at.is_none_or(|e| e > now))
        .map(|f| {
            (
                relevance(&f.fact_type),
                render_line(&f.fact_type, &f.value),
                f.expires_at,
            )
        })
        .filter(|(_, line, _)| !line.is_empty())
        .collect();
    lines.sort_by(|a, b| a.1.cmp(&b.1));
    lines.dedup_by(|a, b| a.1 == b.1);
    let mut content = join(&lines);
    let mut tokens = tok.count(&content);
    while tokens > max_tokens && !lines.is_empty() {
        let victim = lines
            .iter()
            .enumerate()
            .max_by(|(ia, a), (ib, b)| a.0.cmp(&b.0).then(ia.cmp(ib)))
            .map(|(i, _)| i)
            .expect("lines is not empty");
        lines.remove(victim);
        content = join(&lines);
        tokens = tok.count(&content);
    }
    Built {
        version: version_of(&content),
        tokens,
        fact_count: lines.len(),
        next_expiry_at: lines.iter().filter_map(|l| l.2).min(),
        content,
    }
}

fn join(lines: &[(Relevance, String, Option<DateTime<Utc>>)]) -> String {
    lines
        .iter()
        .map(|l| l.1.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The stored digest of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub version: String,
    pub content: String,
}

/// Reads the session's facts and builds its digest (no write).
pub async fn build_for(
    pool: &PgPool,
    session_id: &str,
    max_tokens: usize,
    tok: &dyn TokenCount,
) -> Result<Built, sqlx::Error> {
    let rows = sqlx::query(include_str!("../../sql/digest/active_facts.sql"))
        .bind(session_id)
        .fetch_all(pool)
        .await?;
    let facts = rows
        .iter()
        .map(|r| {
            Ok(Fact {
                fact_type: r.try_get("type")?,
                value: r.try_get("value")?,
                expires_at: r.try_get("expires_at")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(build(&facts, Utc::now(), max_tokens, tok))
}

/// Rebuilds and stores a session's digest; returns it and whether its version changed.
/// The dirty marker is cleared only if no fact changed while we were reading.
pub async fn rebuild(
    pool: &PgPool,
    session_id: &str,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<(Built, bool), sqlx::Error> {
    let marked: Option<DateTime<Utc>> =
        sqlx::query_scalar(include_str!("../../sql/digest/dirty_since.sql"))
            .bind(session_id)
            .fetch_optional(pool)
            .await?;
    let built = build_for(pool, session_id, max_tokens, tok).await?;
    let changed: Option<String> = sqlx::query_scalar(include_str!("../../sql/digest/upsert.sql"))
        .bind(session_id)
        .bind(&built.version)
        .bind(&built.content)
        .bind(built.tokens as i32)
        .bind(built.fact_count as i32)
        .bind(built.next_expiry_at)
        .fetch_optional(pool)
        .await?;
    if let Some(marked) = marked {
        sqlx::query(include_str!("../../sql/digest/clear_dirty.sql"))
            .bind(session_id)
            .bind(marked)
            .execute(pool)
            .await?;
    }
    let changed = changed.is_some();
    if changed {
        metrics.digest_rebuilt();
        sqlx::query(include_str!("../../sql/digest/event_rebuilt.sql"))
            .bind(session_id)
            .bind(serde_json::json!({ "digest_version": built.version, "facts": built.fact_count }))
            .execute(pool)
            .await?;
    }
    Ok((built, changed))
}

/// The digest a turn should use: the stored row, or a fresh build when there is none yet.
pub async fn current(
    pool: &PgPool,
    session_id: &str,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<Stored, sqlx::Error> {
    let row = sqlx::query(include_str!("../../sql/digest/current.sql"))
        .bind(session_id)
        .fetch_optional(pool)
        .await?;
    if let Some(row) = row {
        return Ok(Stored {
            version: row.try_get("digest_version")?,
            content: row.try_get("digest_content")?,
        });
    }
    let (built, _) = rebuild(pool, session_id, max_tokens, tok, metrics).await?;
    Ok(Stored {
        version: built.version,
        content: built.content,
    })
}

/// Keeps digests fresh while the worker runs: LISTEN for fact changes, rescan dirty
/// markers on every poll and after every reconnect, and wake at the next expiry.
pub async fn run_rebuilder(
    pool: PgPool,
    tok: Arc<dyn TokenCount>,
    max_tokens: usize,
    poll: Duration,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        match listen_and_rebuild(&pool, tok.as_ref(), max_tokens, poll, &metrics, &shutdown).await {
            Ok(()) => return,
            Err(e) => {
                failures = (failures + 1).min(8);
                warn!(error = %e, "digest listener lost; reconnecting");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(50 << failures)) => {}
                }
            }
        }
    }
}

async fn listen_and_rebuild(
    pool: &PgPool,
    tok: &dyn TokenCount,
    max_tokens: usize,
    poll: Duration,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(FACTS_CHANNEL).await?;
    info!("digest rebuilder listening");
    // Anything marked while we were not listening is found here.
    rebuild_due(pool, tok, max_tokens, metrics).await?;
    loop {
        let wait = next_wait(pool, poll).await?;
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            n = listener.try_recv() => match n? {
                Some(n) => {
                    let sid = n.payload().to_string();
                    let (built, changed) = rebuild(pool, &sid, max_tokens, tok, metrics).await?;
                    debug!(sid, changed, version = %built.version, "digest rebuilt on notify");
                }
                None => {
                    warn!("digest listener reconnected; rescanning dirty markers");
                    rebuild_due(pool, tok, max_tokens, metrics).await?;
                }
            },
            _ = tokio::time::sleep(wait) => {
                rebuild_due(pool, tok, max_tokens, metrics).await?;
            }
        }
    }
}

/// How long to sleep: until the next fact expiry, at most one poll interval.
async fn next_wait(pool: &PgPool, poll: Duration) -> Result<Duration, sqlx::Error> {
    let next: Option<DateTime<Utc>> =
        sqlx::query_scalar(include_str!("../../sql/digest/next_expiry.sql"))
            .fetch_one(pool)
            .await?;
    let Some(next) = next else { return Ok(poll) };
    let until = (next - Utc::now()).to_std().unwrap_or(Duration::ZERO);
    Ok(until.min(poll) + Duration::from_millis(5))
}

/// Rebuilds every session that is dirty or has an expired fact in its digest.
pub async fn rebuild_due(
    pool: &PgPool,
    tok: &dyn TokenCount,
    max_tokens: usize,
    metrics: &Metrics,
) -> Result<usize, sqlx::Error> {
    let due: Vec<String> = sqlx::query_scalar(include_str!("../../sql/digest/due.sql"))
        .fetch_all(pool)
        .await?;
    for sid in &due {
        rebuild(pool, sid, max_tokens, tok, metrics).await?;
    }
    Ok(due.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::tokens::WordCount;

    fn fact(t: &str, v: &str) -> Fact {
        Fact {
            fact_type: t.into(),
            value: v.into(),
            expires_at: None,
        }
    }

    #[test]
    fn seed_example_renders_sorted() {
        let facts = vec![
            fact("debt", "Owes 500 credits to First Bank"),
            fact("conflict", "War with Merchant Guild  over trade routes  "),
            fact("alliance", "Tech Syndicate partnership"),
        ];
        let b = build(&facts, Utc::now(), 180, &WordCount);
        assert_eq!(
            b.content,
            "Alliance: Tech Syndicate partnership\nConflict: War with Merchant Guild over trade routes\nDebt: Owes 500 credits to First Bank"
        );
        assert_eq!(b.version, version_of(&b.content));
        assert_eq!(b.version.len(), 64);
    }

    #[test]
    fn order_does_not_matter() {
        let mut facts = vec![
            fact("quest", "Find the relic"),
            fact("rumor", "Gate closes"),
            fact("debt", "Owes 5"),
        ];
        let a = build(&facts, Utc::now(), 180, &WordCount);
        facts.reverse();
        assert_eq!(a, build(&facts, Utc::now(), 180, &WordCount));
    }

    #[test]
    fn trimming_drops_unknown_then_ephemeral() {
        let facts = vec![
            fact("conflict", "a b c"),
            fact("buff", "d e f"),
            fact("gossip", "g h i"),
        ];
        // Each line is 4 words; 8 fits two lines.
        let b = build(&facts, Utc::now(), 8, &WordCount);
        assert_eq!(b.content, "Buff: d e f\nConflict: a b c");
        let b = build(&facts, Utc::now(), 4, &WordCount);
        assert_eq!(b.content, "Conflict: a b c");
    }

    #[test]
    fn expired_facts_are_out() {
        let now = Utc::now();
        let mut buff = fact("buff", "Shielded");
        buff.expires_at = Some(now - chrono::Duration::seconds(1));
        let b = build(&[buff.clone(), fact("debt", "x")], now, 180, &WordCount);
        assert_eq!(b.content, "Debt: x");
        buff.expires_at = Some(now + chrono::Duration::seconds(5));
        let b = build(&[buff.clone(), fact("debt", "x")], now, 180, &WordCount);
        assert_eq!(b.content, "Buff: Shielded\nDebt: x");
        assert_eq!(b.next_expiry_at, buff.expires_at);
    }
}
