//! Seed 004's "remember this about Florent" with no fact given: what the user said about
//! the person in the recent conversation becomes one third-person fact, remembered like
//! an explicit remember (pinned, merged into the blob). The extraction model summarises
//! when it is loaded; its summary is kept only when it passes the grounding filter
//! against those messages, and otherwise (or without a model) the user's own sentences
//! about the person are rewritten in the third person.

use serde_json::json;

use crate::memory::error::{MemoryError, Result};
use crate::memory::notes::blob::{rebuild_blob, third_person};
use crate::memory::search::content_words;
use crate::memory::service::MemoryService;
use crate::memory::store::filters::{check_fact, Verdict};
use crate::memory::store::{self, FactType, Kind, NewMemory, Scope, Source};

/// How far back "the recent conversation" goes, in the user's messages.
pub const WINDOW_MESSAGES: i64 = 20;
/// Longest fact stored.
pub const MAX_FACT_CHARS: usize = 400;

const PRONOUNS: [&str; 6] = ["he", "she", "they", "his", "her", "their"];

/// The user's sentences about `name` in `messages` (oldest first): sentences naming them,
/// and sentences that go on about them with a pronoun right after one that did.
pub fn sentences_about(name: &str, messages: &[String]) -> Vec<String> {
    let keys: Vec<String> = name_words(name);
    let mut out = Vec::new();
    let mut following = false;
    for m in messages {
        for s in m.split_inclusive(['.', '!', '?', '\n']) {
            let s = s.trim();
            if s.is_empty() {
                continue;
            }
            let words = content_words(s);
            let names_them = keys.iter().any(|k| words.contains(k));
            let first = s
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_lowercase();
            if names_them || (following && PRONOUNS.contains(&first.as_str())) {
                out.push(s.to_string());
                following = true;
            } else {
                following = false;
            }
        }
    }
    out
}

/// The words that identify the person: the capitalised ones ("my brother Tom" → tom), or
/// every content word when none is.
fn name_words(name: &str) -> Vec<String> {
    let caps: Vec<String> = name
        .split_whitespace()
        .filter(|w| w.chars().next().is_some_and(char::is_uppercase))
        .flat_map(content_words)
        .collect();
    if caps.is_empty() {
        content_words(name)
    } else {
        caps
    }
}

/// The sentences in the third person, a leading pronoun replaced by the name.
pub fn rewrite(name: &str, sentences: &[String]) -> String {
    let person = name_words(name)
        .first()
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        })
        .unwrap_or_else(|| name.to_string());
    let text = sentences
        .iter()
        .map(|s| {
            let (first, rest) = s.split_once(' ').unwrap_or((s, ""));
            let s = if PRONOUNS[..3].contains(&first.to_lowercase().as_str()) {
                format!("{person} {rest}")
            } else {
                s.clone()
            };
            let t = third_person(&s);
            if t.ends_with(['.', '!', '?']) {
                t
            } else {
                format!("{t}.")
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    text.chars().take(MAX_FACT_CHARS).collect()
}

/// Runs a `remember_about` job.
pub async fn remember_about(
    svc: &MemoryService,
    scope: &Scope,
    payload: &serde_json::Value,
) -> Result<serde_json::Value> {
    let name = payload["name"]
        .as_str()
        .ok_or_else(|| MemoryError::Invalid("remember_about job without a name".into()))?;
    let session = payload["session_id"].as_str().unwrap_or_default();
    let turn = payload["turn_id"].as_i64().unwrap_or(0);
    let rows: Vec<(String, String)> =
        sqlx::query_as(include_str!("../../../sql/memory/about_window.sql"))
            .bind(&scope.user_id)
            .bind(session)
            .bind(turn)
            .bind(WINDOW_MESSAGES)
            .fetch_all(&svc.pool)
            .await?;
    // Oldest first, so pronouns follow the sentence that named the person.
    // Decoded by position: `about_window.sql` selects message_id, then text.
    let (ids, texts): (Vec<String>, Vec<String>) = rows.into_iter().rev().unzip();
    let said = sentences_about(name, &texts);
    if said.is_empty() {
        return Ok(json!({
            "stored": false,
            "reason": format!("nothing about {name} in the last {} messages", texts.len()),
        }));
    }
    let evidence = said.join(" ");
    let (fact, method, model) = match svc.extractor.clone() {
        Some(ex) => ask_the_model(ex, name, &said, &evidence).await,
        None => (rewrite(name, &said), "sentences", serde_json::Value::Null),
    };
    let used: Vec<String> = ids
        .into_iter()
        .zip(&texts)
        .filter(|(_, t)| said.iter().any(|s| t.contains(s.as_str())))
        .map(|(id, _)| id)
        .collect();
    let up = store_about(svc, scope, name, &fact, &evidence, &used).await?;
    let blob = rebuild_blob(svc, scope).await?;
    Ok(json!({
        "stored": true,
        "memory_id": up.id(),
        "text": fact,
        "method": method,
        "model": model,
        "from_messages": used,
        "blob": blob,
    }))
}

/// The fact about `name`: the model's summary of what was `said` when it passes the fact
/// filters and names them, else the sentences rewritten. With it, how it was made and what
/// the model proposed (and why it was not kept), for the job's result.
async fn ask_the_model(
    ex: std::sync::Arc<dyn crate::memory::extractor::Extractor>,
    name: &str,
    said: &[String],
    evidence: &str,
) -> (String, &'static str, serde_json::Value) {
    let fallback = rewrite(name, said);
    let (n, e) = (name.to_string(), evidence.to_string());
    let answer = tokio::task::spawn_blocking(move || ex.summarize_about(&n, &e))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.0));
    let summary = match answer {
        Err(e) => return (fallback, "sentences", json!({"error": e})),
        Ok(summary) => summary,
    };
    let mentions = name_words(name)
        .iter()
        .any(|k| content_words(&summary).contains(k));
    match check_fact(&summary, "relationship", None, evidence) {
        Verdict::Accepted(c) if mentions => {
            (c.text, "model", json!({"text": summary, "kept": true}))
        }
        Verdict::Accepted(_) => (
            fallback,
            "sentences",
            json!({"text": summary, "kept": false, "why": "does not name them"}),
        ),
        Verdict::Rejected(r) => (
            fallback,
            "sentences",
            json!({"text": summary, "kept": false, "why": r.filter()}),
        ),
    }
}

/// Stores `fact` about `name` as a pinned relationship memory of the user, with the
/// messages it came from.
async fn store_about(
    svc: &MemoryService,
    scope: &Scope,
    name: &str,
    fact: &str,
    evidence: &str,
    used: &[String],
) -> Result<store::Upserted> {
    let mut m = NewMemory::new(
        &scope.user_id,
        Kind::People,
        FactType::Relationship,
        fact,
        Source::Explicit,
    );
    m.character_id = scope.character_id;
    m.guild_id = scope.guild_id.clone();
    m.pinned = true;
    m.confidence = 1.0;
    m.evidence_text = Some(evidence.chars().take(MAX_FACT_CHARS).collect());
    m.source_message_ids = used.to_vec();
    m.entity_refs = name_words(name)
        .first()
        .map(|w| vec![format!("person:{w}")])
        .unwrap_or_default();
    svc.embed_memory(&mut m).await;
    store::upsert(&svc.pool, m).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_follow_the_person_through_pronouns() {
        let msgs = vec![
            "My friend Florent moved to Montreal. He bakes bread there. The weather is cold."
                .to_string(),
            "Anyway, I like tea.".to_string(),
            "Florent also plays the cello.".to_string(),
        ];
        let said = sentences_about("Florent", &msgs);
        assert_eq!(
            said,
            vec![
                "My friend Florent moved to Montreal.",
                "He bakes bread there.",
                "Florent also plays the cello."
            ]
        );
        assert_eq!(
            rewrite("Florent", &said),
            "The user's friend Florent moved to Montreal. Florent bakes bread there. Florent also plays the cello."
        );
        assert!(sentences_about("Priya", &msgs).is_empty());
    }
}
