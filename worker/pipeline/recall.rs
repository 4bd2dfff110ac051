//! What the memory layers hand a turn before it touches the KV: the recall candidates for
//! the user message (entity cards first, then memories and past dialogue, ranked) and the
//! context block (last session summary, user context, spine) with its version. Reading
//! only: no model call but embeddings (the query's, and the lines the relevance gate
//! compares with it), and a failure degrades to nothing
//! recalled instead of failing the turn. Which candidates the KV already holds is decided
//! on the engine thread ([`super::kv`]), from the segment table.

use std::time::Instant;

use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::memory::search::cards;
use crate::memory::search::{self, HitKind, SearchRequest};
use crate::memory::store::Scope;
use crate::memory::MemoryService;
use crate::summary::cache::content_hash;
use crate::turn::{self, ClaimedTurn};

/// The speaker of a character's own replies in the dialogue corpus.
const ASSISTANT: &str = "assistant";
/// Candidates asked of the search; the token budget decides how many are injected.
const RECALL_CANDIDATES: usize = 6;
/// A dialogue hit longer than this is clipped: one long message must not take the budget.
const ITEM_MAX_CHARS: usize = 240;

/// One thing recall may inject.
#[derive(Debug, Clone, PartialEq)]
pub struct RecallItem {
    /// `c<hash>` (an entity card, by content), `m<id>` (a memory), `x<hash>` (a message
    /// of past dialogue, by speaker and text, so a replay's copy of a session recalls
    /// under the same keys): what a recall segment's tag records.
    pub key: String,
    pub text: String,
}

/// What recall found for one message, and how long it took.
#[derive(Debug, Clone, Default)]
pub struct Recalled {
    pub items: Vec<RecallItem>,
    pub ms: u64,
}

/// The search's scope for a turn: the turn's own user and character, nobody else's.
pub fn scope(turn: &ClaimedTurn) -> Scope {
    Scope {
        user_id: turn.user_id.clone(),
        character_id: Some(turn.character_id),
        guild_id: None,
        channel_id: None,
    }
}

/// Hybrid retrieval for `query` (the user message): cards for the entities of the hits
/// first, then the hits in rank order. Retrieval trouble is logged and recalls nothing.
pub async fn gather(svc: &MemoryService, turn: &ClaimedTurn, query: &str) -> Recalled {
    let started = Instant::now();
    let items = match candidates(svc, turn, query).await {
        Ok(items) => items,
        Err(e) => {
            tracing::warn!(error = %e, "recall failed; the turn goes on without it");
            Vec::new()
        }
    };
    Recalled {
        items,
        ms: started.elapsed().as_millis() as u64,
    }
}

async fn candidates(
    svc: &MemoryService,
    turn: &ClaimedTurn,
    query: &str,
) -> crate::memory::Result<Vec<RecallItem>> {
    if search::content_words(query).is_empty() {
        return Ok(Vec::new());
    }
    let req = SearchRequest {
        scope: scope(turn),
        query: query.to_string(),
        limit: RECALL_CANDIDATES,
        as_of: None,
        ranker: svc.config.ranker,
        strict: true,
        // What the user told the character, never the character's own earlier replies.
        skip_speaker: Some(ASSISTANT.to_string()),
    };
    let hits = search::lines_to_recall(svc, &req, &clip).await?;
    let mut items = Vec::new();
    for card in cards::cards_for_hits(&svc.pool, &req.scope, &hits).await? {
        items.push(RecallItem {
            key: format!("c{}", short_hash(&card.text)),
            text: card.text,
        });
    }
    for hit in hits.iter().filter(|h| visible(h, &turn.session_id)) {
        let item = match hit.kind {
            HitKind::Memory => RecallItem {
                key: format!("m{}", hit.id.trim_start_matches("memory:")),
                text: clip(&hit.text),
            },
            HitKind::Message | HitKind::Summary => RecallItem {
                key: format!(
                    "x{}",
                    short_hash(&format!("{:?}\n{}", hit.speaker, hit.text))
                ),
                text: dialogue_line(hit),
            },
        };
        if !items.iter().any(|i| i.key == item.key) {
            items.push(item);
        }
    }
    Ok(items)
}

/// Dialogue recall is over other sessions: this session's recent turns are in the KV, and
/// what lies before them is its rolling summary's and compaction's. Replays copy sessions
/// under `replay:<run>:<source>`; a replay never recalls its source session (whose later
/// turns it has not reached), and nobody recalls a replay's copy.
fn visible(hit: &search::Hit, session_id: &str) -> bool {
    let Some(hit_session) = hit.session_id.as_deref() else {
        return true;
    };
    hit_session != session_id
        && !turn::is_replay(hit_session)
        && turn::replay_source(session_id) != Some(hit_session)
}

/// A message as recall shows it: who said it, when, and what.
fn dialogue_line(hit: &search::Hit) -> String {
    let who = match hit.speaker.as_deref() {
        Some("assistant") => "you",
        Some("user") | None => "they",
        Some(other) => other,
    };
    match hit.at {
        Some(at) => format!(
            "On {}, {who} said: {}",
            at.format("%Y-%m-%d"),
            clip(&hit.text)
        ),
        None => format!("{who} said: {}", clip(&hit.text)),
    }
}

fn clip(text: &str) -> String {
    let text = text.trim();
    if text.chars().count() <= ITEM_MAX_CHARS {
        return text.to_string();
    }
    let cut: String = text.chars().take(ITEM_MAX_CHARS).collect();
    let cut = cut.rsplit_once(' ').map_or(cut.as_str(), |(a, _)| a);
    format!("{cut}…")
}

/// A recall key's hash: the first 5 bytes of the content's SHA-256, in hex.
fn short_hash(text: &str) -> String {
    content_hash(text)[..10].to_string()
}

/// The context block's text and version (SHA-256 of the text; empty text = no block).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContextBlock {
    pub content: String,
    pub version: String,
}

impl ContextBlock {
    pub fn of(content: String) -> ContextBlock {
        let version = if content.is_empty() {
            String::new()
        } else {
            hex::encode(Sha256::digest(content.as_bytes()))
        };
        ContextBlock { content, version }
    }
}

/// The parts of the context block, in the order they are kept when the budget is short.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContextParts {
    /// The newest valid summary of a closed session with this character.
    pub last_session: String,
    /// Seed 004's merged user context (facts, today, days 2–7).
    pub user_context: String,
    /// The user's spine (PROFILE / PROJECTS / PEOPLE / OPEN_LOOPS).
    pub spine: String,
    /// Seed 001's open todos with this character, in the user's words.
    pub todos: String,
}

/// Reads the stored parts for the turn's user and character. Nothing is computed here:
/// the summary lane made them when the last session closed.
pub async fn context_parts(pool: &PgPool, turn: &ClaimedTurn) -> Result<ContextParts, sqlx::Error> {
    type Row = (
        Option<serde_json::Value>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let row: Option<Row> = sqlx::query_as(include_str!("../../sql/turn/context_parts.sql"))
        .bind(&turn.user_id)
        .bind(turn.character_id)
        .fetch_optional(pool)
        .await?;
    let Some((summary, user_context, spine, todos)) = row else {
        return Ok(ContextParts::default());
    };
    Ok(ContextParts {
        last_session: summary.as_ref().map(session_line).unwrap_or_default(),
        user_context: user_context.unwrap_or_default().trim().to_string(),
        spine: spine.unwrap_or_default().trim().to_string(),
        todos: todos.unwrap_or_default().trim().to_string(),
    })
}

/// Seed 001's session summary as one paragraph.
fn session_line(v: &serde_json::Value) -> String {
    let list = |key: &str| -> Vec<String> {
        v[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = v["one_liner"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_string();
    let mattered = list("what_mattered");
    if !mattered.is_empty() {
        out.push_str(&format!(" What mattered: {}.", mattered.join("; ")));
    }
    let open = list("open_loops");
    if !open.is_empty() {
        out.push_str(&format!(" Still open: {}.", open.join("; ")));
    }
    let people = list("people");
    if !people.is_empty() {
        out.push_str(&format!(" People: {}.", people.join(", ")));
    }
    out.trim().to_string()
}

/// The context block within `max` tokens. Parts are labelled and kept in priority order:
/// the last session first, then the open todos with this character, then the user
/// context, then the spine; a part that does not
/// fit whole is cut at a word and the rest is left out.
pub fn context_block(
    parts: &ContextParts,
    max: usize,
    count: &dyn Fn(&str) -> usize,
) -> ContextBlock {
    let labelled = [
        ("Last session", &parts.last_session),
        ("Open with you", &parts.todos),
        ("What you know of them", &parts.user_context),
        ("Their profile", &parts.spine),
    ];
    let mut text = String::new();
    for (label, body) in labelled {
        if body.is_empty() {
            continue;
        }
        let line = format!("{label}: {body}");
        let joined = |t: &str| {
            if text.is_empty() {
                t.to_string()
            } else {
                format!("{text}\n{t}")
            }
        };
        if count(&joined(&line)) <= max {
            text = joined(&line);
            continue;
        }
        // The longest word-prefix of the line that fits.
        let words: Vec<&str> = line.split_whitespace().collect();
        let (mut lo, mut hi) = (0usize, words.len());
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if count(&joined(&format!("{}…", words[..mid].join(" ")))) <= max {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        if lo > 2 {
            text = joined(&format!("{}…", words[..lo].join(" ")));
        }
        break;
    }
    ContextBlock::of(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(t: &str) -> usize {
        t.split_whitespace().count()
    }

    #[test]
    fn the_context_keeps_parts_in_priority_order_within_the_budget() {
        let parts = ContextParts {
            last_session: "They planned a trip to Porto.".into(),
            user_context: "They live with their sister Maya in Lisbon and like trains.".into(),
            spine: "PROFILE: teacher".into(),
            todos: "I'll call Maya on Friday (due 2026-11-27)".into(),
        };
        let all = context_block(&parts, 100, &words);
        assert!(all
            .content
            .contains("\nOpen with you: I'll call Maya on Friday"));
        assert!(all.content.starts_with("Last session: They planned"));
        assert!(all.content.contains("Their profile: PROFILE: teacher"));
        assert_eq!(all.version.len(), 64);

        let cut = context_block(&parts, 12, &words);
        assert!(words(&cut.content) <= 12, "{}", cut.content);
        assert!(cut.content.contains("Porto"));
        assert!(!cut.content.contains("teacher"));
        assert_ne!(cut.version, all.version);

        let none = context_block(&ContextParts::default(), 100, &words);
        assert_eq!(none, ContextBlock::default());
    }

    #[test]
    fn recall_keys_hash_the_first_five_bytes() {
        // Keys are stored in snapshots' segment tables; they must not change.
        let want = hex::encode(&Sha256::digest(b"Maya lives in Lisbon")[..5]);
        assert_eq!(short_hash("Maya lives in Lisbon"), want);
    }

    #[test]
    fn replays_recall_neither_their_source_nor_other_replays() {
        let hit = |session: &str| search::Hit {
            kind: HitKind::Message,
            id: "turn:1:user".into(),
            text: "hello".into(),
            score: 1.0,
            components: Default::default(),
            source_message_ids: Vec::new(),
            session_id: Some(session.into()),
            speaker: Some("user".into()),
            at: None,
            entity_refs: Vec::new(),
        };
        assert!(!visible(&hit("a"), "a"));
        assert!(visible(&hit("b"), "a"));
        assert!(!visible(&hit("replay:r1:a"), "a"));
        assert!(!visible(&hit("a"), "replay:r1:a"));
        assert!(visible(&hit("b"), "replay:r1:a"));
        assert!(!visible(&hit("replay:r0:a"), "replay:r1:a"));
        assert!(!visible(&hit("replay:r1:a"), "replay:r1:a"));
    }

    #[test]
    fn a_session_summary_reads_as_one_paragraph() {
        let v = serde_json::json!({"one_liner": "Talked about travel.", "what_mattered": ["a trip to Porto"],
            "open_loops": [], "commitments": [], "people": ["Maya"], "tone": "warm"});
        assert_eq!(
            session_line(&v),
            "Talked about travel. What mattered: a trip to Porto. People: Maya."
        );
    }
}
