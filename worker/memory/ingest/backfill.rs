//! Vectors a row lacks, filled by the memory lane: a search only reads, so the few facts
//! and messages stored without a vector (while no embedder was loaded) get theirs here,
//! a handful beside each ingest job, and are scored lexically until then.

use pgvector::Vector;

use crate::memory::embed::{to_bytes, Role};
use crate::memory::error::Result;
use crate::memory::search::message_key;
use crate::memory::service::MemoryService;
use crate::memory::store::embed_text;

/// Seed 002's "up to 8 missing vectors per query", now per lane job and per kind.
pub const BACKFILL_PER_JOB: i64 = 8;

#[derive(sqlx::FromRow)]
struct VectorlessMessage {
    id: i64,
    speaker: String,
    text: String,
    context: Option<String>,
}

#[derive(sqlx::FromRow)]
struct VectorlessFact {
    id: i64,
    fact_type: String,
    text: String,
    evidence_text: Option<String>,
}

/// Embeds up to [`BACKFILL_PER_JOB`] of `user`'s messages and as many facts that have no
/// vector at all; returns how many vectors it stored. Without an embedder, or when the
/// embedding fails (an event the embedder records), it stores none.
pub async fn fill_vectorless(svc: &MemoryService, user: &str) -> Result<usize> {
    if svc.embedder.is_none() {
        return Ok(0);
    }
    let messages: Vec<VectorlessMessage> = sqlx::query_as(
        svc.columns()
            .sql(include_str!("../../../sql/memory/vectorless_messages.sql")),
    )
    .bind(user)
    .bind(BACKFILL_PER_JOB)
    .fetch_all(&svc.pool)
    .await?;
    let facts: Vec<VectorlessFact> =
        sqlx::query_as(include_str!("../../../sql/memory/vectorless_facts.sql"))
            .bind(user)
            .bind(BACKFILL_PER_JOB)
            .fetch_all(&svc.pool)
            .await?;
    let mut texts: Vec<String> = messages
        .iter()
        .map(|m| message_key(&m.speaker, &m.text, m.context.as_deref()))
        .collect();
    texts.extend(
        facts
            .iter()
            .map(|f| embed_text(&f.fact_type, &f.text, f.evidence_text.as_deref())),
    );
    if texts.is_empty() {
        return Ok(0);
    }
    let Some(mut vecs) = svc.embed(texts, Role::Passage).await else {
        return Ok(0);
    };
    let fact_vecs = vecs.split_off(messages.len());
    let ids: Vec<i64> = messages.iter().map(|m| m.id).collect();
    let vectors: Vec<Vector> = vecs.into_iter().map(Vector::from).collect();
    sqlx::query(
        svc.columns()
            .sql(include_str!("../../../sql/memory/set_message_vectors.sql")),
    )
    .bind(&ids)
    .bind(&vectors)
    .bind(svc.model_id())
    .execute(&svc.pool)
    .await?;
    let fact_ids: Vec<i64> = facts.iter().map(|f| f.id).collect();
    let bytes: Vec<Vec<u8>> = fact_vecs.iter().map(|v| to_bytes(v)).collect();
    sqlx::query(include_str!("../../../sql/memory/set_memory_vectors.sql"))
        .bind(&fact_ids)
        .bind(&bytes)
        .bind(svc.model_id())
        .execute(&svc.pool)
        .await?;
    Ok(ids.len() + fact_ids.len())
}

/// Rows the idle re-embed takes per step and kind: a step runs only while no turn is
/// generating, and a turn that arrives waits for at most this many embeddings.
pub const REEMBED_PER_STEP: i64 = 16;

/// How far this process's idle re-embed has got, per kind: rows up to these ids are done,
/// and `None` once a kind's pass has reached its end. After a switch of embedder every
/// stored message, span and fact lacks a vector of the new model; the worker's idle lanes
/// give them theirs a step at a time, in id order, and searches meanwhile score them
/// lexically. One pass per process: rows stored later get their vectors from their own
/// lane job.
#[derive(Debug)]
pub struct Reembed {
    messages: Option<i64>,
    spans: Option<i64>,
    facts: Option<i64>,
}

impl Default for Reembed {
    fn default() -> Reembed {
        Reembed {
            messages: Some(0),
            spans: Some(0),
            facts: Some(0),
        }
    }
}

impl Reembed {
    /// True once every kind's pass has reached its end.
    pub fn is_done(&self) -> bool {
        self.messages.is_none() && self.spans.is_none() && self.facts.is_none()
    }

    /// One step: up to [`REEMBED_PER_STEP`] messages, spans and facts of any user without
    /// a vector of the service's model; returns how many vectors it stored. Without an
    /// embedder it does nothing. A failed embedding (an event the embedder records) ends
    /// that kind's pass in this process, so a broken model is not retried every poll.
    pub async fn step(&mut self, svc: &MemoryService) -> Result<usize> {
        if svc.embedder.is_none() {
            return Ok(0);
        }
        let mut stored = 0;
        if let Some(after) = self.messages {
            let (n, next) = messages_after(svc, after).await?;
            stored += n;
            self.messages = next;
        }
        if let Some(mut after) = self.spans {
            let filled = crate::memory::search::spans::fill_after(
                svc,
                None,
                &mut after,
                Some(REEMBED_PER_STEP as usize),
                true,
                &|_| (),
            )
            .await;
            match filled {
                Ok(0) => self.spans = None,
                Ok(n) => {
                    stored += n;
                    self.spans = Some(after);
                }
                // Recorded as an event by the embedder: this process's pass ends.
                Err(_) => self.spans = None,
            }
        }
        if let Some(after) = self.facts {
            let (n, next) = facts_after(svc, after).await?;
            stored += n;
            self.facts = next;
        }
        Ok(stored)
    }
}

/// The next few messages after `after` without a vector of the service's model, embedded
/// and stored: how many, and where the next step starts (`None`: the end was reached, or
/// the embedding failed).
async fn messages_after(svc: &MemoryService, after: i64) -> Result<(usize, Option<i64>)> {
    let rows: Vec<VectorlessMessage> = sqlx::query_as(
        svc.columns()
            .sql(include_str!("../../../sql/memory/unembedded_messages.sql")),
    )
    .bind(None::<&str>)
    .bind(after)
    .bind(REEMBED_PER_STEP)
    .bind(svc.model_id())
    .fetch_all(&svc.pool)
    .await?;
    let Some(last) = rows.last().map(|m| m.id) else {
        return Ok((0, None));
    };
    let texts = rows
        .iter()
        .map(|m| message_key(&m.speaker, &m.text, m.context.as_deref()))
        .collect();
    let Some(vecs) = svc.embed(texts, Role::Passage).await else {
        return Ok((0, None));
    };
    let ids: Vec<i64> = rows.iter().map(|m| m.id).collect();
    let vectors: Vec<Vector> = vecs.into_iter().map(Vector::from).collect();
    sqlx::query(
        svc.columns()
            .sql(include_str!("../../../sql/memory/set_message_vectors.sql")),
    )
    .bind(&ids)
    .bind(&vectors)
    .bind(svc.model_id())
    .execute(&svc.pool)
    .await?;
    Ok((ids.len(), Some(last)))
}

/// [`messages_after`] for facts (their vectors are bytes in `memories`, of any width).
async fn facts_after(svc: &MemoryService, after: i64) -> Result<(usize, Option<i64>)> {
    let rows: Vec<VectorlessFact> =
        sqlx::query_as(include_str!("../../../sql/memory/unembedded_memories.sql"))
            .bind(None::<&str>)
            .bind(after)
            .bind(REEMBED_PER_STEP)
            .bind(svc.model_id())
            .fetch_all(&svc.pool)
            .await?;
    let Some(last) = rows.last().map(|f| f.id) else {
        return Ok((0, None));
    };
    let texts = rows
        .iter()
        .map(|f| embed_text(&f.fact_type, &f.text, f.evidence_text.as_deref()))
        .collect();
    let Some(vecs) = svc.embed(texts, Role::Passage).await else {
        return Ok((0, None));
    };
    let ids: Vec<i64> = rows.iter().map(|f| f.id).collect();
    let bytes: Vec<Vec<u8>> = vecs.iter().map(|v| to_bytes(v)).collect();
    sqlx::query(include_str!("../../../sql/memory/set_memory_vectors.sql"))
        .bind(&ids)
        .bind(&bytes)
        .bind(svc.model_id())
        .execute(&svc.pool)
        .await?;
    Ok((ids.len(), Some(last)))
}
