//! The digest's text: facts sorted by relevance, rendered as canonical lines within the
//! token budget, and the SHA-256 of that text as its version.

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};

use crate::context::tokens::TokenCount;

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
