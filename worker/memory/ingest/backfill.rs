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
    let messages: Vec<VectorlessMessage> =
        sqlx::query_as(include_str!("../../../sql/memory/vectorless_messages.sql"))
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
    sqlx::query(include_str!("../../../sql/memory/set_message_vectors.sql"))
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
