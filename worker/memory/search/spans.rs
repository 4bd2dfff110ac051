//! The span leg: each message also has the vector of its span (it and the four turns
//! before it in its session, embedded as one text), so a question that names the topic of
//! an exchange finds the turns inside it that never repeat the topic's words. A message
//! scores the best span it sits in. The vectors are filled after the messages are stored
//! (import, the memory lane, reindex), when the turns before each one are there.

use std::collections::HashMap;

use pgvector::Vector;

use super::super::embed::{EmbedError, Keep, Role};
use super::super::error::{MemoryError, Result};
use super::super::service::MemoryService;
use super::types::SearchRequest;
use super::vector::nearest;

/// Spans read per search; each spreads to up to five messages. On the tune half the top
/// 50 did as well as every span of the user, and the top 30 lost 0.01 of R@10.
pub(super) const SPAN_CANDIDATES: i64 = 50;
/// Spans embedded per round trip while filling.
const FILL_CHUNK: i64 = 256;

#[derive(sqlx::FromRow)]
struct SpanText {
    id: i64,
    span: String,
}

/// Gives messages of `user` (all users: `None`) that have no span vector theirs, oldest
/// first, at most `max` of them (`None`: all); returns how many. Without an embedder it
/// does nothing; a failed embedding stops the fill with `MemoryError::Embed` (the rows stay
/// NULL for the next run).
pub async fn fill(svc: &MemoryService, user: Option<&str>, max: Option<usize>) -> Result<usize> {
    fill_counting(svc, user, max, false, &|_| ()).await
}

/// [`fill`], and with `other_models` also the spans another model embedded (reindex after a
/// switch); tells `done_now` how many it stored after each round trip.
pub async fn fill_counting(
    svc: &MemoryService,
    user: Option<&str>,
    max: Option<usize>,
    other_models: bool,
    done_now: &(dyn Fn(usize) + Sync),
) -> Result<usize> {
    fill_after(svc, user, &mut 0, max, other_models, done_now).await
}

/// [`fill_counting`] from the message after `after`, which it moves past each message it
/// read: a caller that fills a little at a time resumes there.
pub async fn fill_after(
    svc: &MemoryService,
    user: Option<&str>,
    after: &mut i64,
    max: Option<usize>,
    other_models: bool,
    done_now: &(dyn Fn(usize) + Sync),
) -> Result<usize> {
    if svc.embedder.is_none() {
        return Ok(0);
    }
    let mut done = 0;
    loop {
        let left = max.map_or(FILL_CHUNK, |m| (m - done.min(m)) as i64);
        if left == 0 {
            return Ok(done);
        }
        let rows: Vec<SpanText> = sqlx::query_as(
            svc.columns()
                .sql(include_str!("../../../sql/memory/span_texts.sql")),
        )
        .bind(user)
        .bind(*after)
        .bind(left.min(FILL_CHUNK))
        .bind(svc.model_id())
        .bind(other_models)
        .fetch_all(&svc.pool)
        .await?;
        let Some(last) = rows.last() else {
            return Ok(done);
        };
        *after = last.id;
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let texts: Vec<String> = rows.into_iter().map(|r| r.span).collect();
        // A long span is cut at its oldest turns: the message it belongs to is its end.
        let vecs = svc
            .embed_keeping(texts, Role::Passage, Keep::End)
            .await
            .ok_or_else(|| {
                MemoryError::Embed(EmbedError::Llama(
                    "span embedding failed (see memory events)".into(),
                ))
            })?;
        let vectors: Vec<Vector> = vecs.into_iter().map(Vector::from).collect();
        sqlx::query(
            svc.columns()
                .sql(include_str!("../../../sql/memory/set_span_vectors.sql")),
        )
        .bind(&ids)
        .bind(&vectors)
        .bind(svc.model_id())
        .execute(&svc.pool)
        .await?;
        done += ids.len();
        done_now(ids.len());
    }
}

/// Each message inside one of the user's nearest spans, with the best span's cosine. A
/// small history is compared exactly, a large one through the HNSW index (as the vector
/// leg does).
pub(super) async fn nearest_spans(
    svc: &MemoryService,
    req: &SearchRequest,
    q: &Vector,
    exact: bool,
) -> Result<HashMap<i64, f64>> {
    let sql = if exact {
        concat!(
            include_str!("../../../sql/memory/search_spans_exact.sql"),
            include_str!("../../../sql/memory/spread_spans.sql")
        )
    } else {
        concat!(
            include_str!("../../../sql/memory/search_spans_index.sql"),
            include_str!("../../../sql/memory/spread_spans.sql")
        )
    };
    let rows = nearest(svc, req, q, sql, exact, SPAN_CANDIDATES).await?;
    Ok(rows.into_iter().collect())
}
