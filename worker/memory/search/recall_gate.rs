//! Lines to recall: the search's hits that are about the message on their own, through the
//! relevance gate of [`super::Components::about`]. The search ranks a turn by its key (the turn
//! with the one it answers) and by the span it sits in, which is right for finding
//! evidence and wrong for injecting it: in a short history every turn shares a span, and a
//! question about the user's sister brought the city they grew up in and their race as
//! well, leaving nothing new for the questions that asked about those.

use super::run::search;
use super::types::{Hit, HitKind, SearchRequest};
use super::words::message_key;
use crate::memory::embed::{self, Role};
use crate::memory::error::Result;
use crate::memory::service::MemoryService;

/// Runs `req` and keeps the hits about its query alone: the embedder's related cosine
/// between the query and the line embedded alone (as `shown` clips it for the turn), or
/// the words of [`super::Components::about_by_words`]. Without an embedder the words decide
/// alone.
pub async fn lines_to_recall(
    svc: &MemoryService,
    req: &SearchRequest,
    shown: &(dyn Fn(&str) -> String + Sync),
) -> Result<Vec<Hit>> {
    let mut found = search(svc, req).await?;
    let query_vector = found.query_vector.take();
    Ok(about_the_query(svc, query_vector.as_deref(), found.hits, shown).await)
}

async fn about_the_query(
    svc: &MemoryService,
    q: Option<&[f32]>,
    hits: Vec<Hit>,
    shown: &(dyn Fn(&str) -> String + Sync),
) -> Vec<Hit> {
    let related = svc.related_cosine().unwrap_or(f64::INFINITY);
    // Facts are statements on their own: the search's cosine is already theirs alone. The
    // other lines are embedded alone, clipped as recall shows them, and only where the
    // words have not let them through already: each costs the turn about what the query
    // did.
    let lone = |h: &Hit| match (h.kind, h.speaker.as_deref()) {
        (HitKind::Memory, _) => None,
        _ if h.components.about_by_words() => None,
        (HitKind::Message, Some(speaker)) => Some(message_key(speaker, &shown(&h.text), None)),
        _ => Some(shown(&h.text)),
    };
    let lines: Vec<Option<String>> = hits.iter().map(lone).collect();
    // The search's own query vector: the message is not embedded a second time.
    let vectors = match q {
        Some(_) if lines.iter().any(Option::is_some) => {
            svc.embed(lines.iter().flatten().cloned().collect(), Role::Passage)
                .await
        }
        _ => None,
    };
    let mut alone = vectors.iter().flatten();
    hits.into_iter()
        .zip(lines)
        .filter(|(h, line)| {
            let cosine = match (line, q) {
                (None, _) => None,
                (Some(_), Some(q)) => {
                    Some(alone.next().map_or(0.0, |v| f64::from(embed::dot(q, v))))
                }
                (Some(_), None) => Some(0.0),
            };
            h.components.about(cosine, related)
        })
        .map(|(h, _)| h)
        .collect()
}
