//! Compaction of a chat session's history (seed 003 on kvmem's dialogue): the session's
//! messages after the current boundary become a `ContextData`, the compactor folds the
//! oldest into `long_term_summary` with the model, and the boundary moves. `messages` is
//! never touched: it stays the record, and the boundary only says what a cold start needs
//! to re-read beside the summary.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::context_manager::{
    bullet_summary, ContextCompactor, ContextData, ContextManager, HistoryEntry,
};
use super::llm::{Prompt, Summarizer};
use super::{clip, Result, SummaryError, SummaryService};

const COMPACT_SYSTEM: &str = "You compress the older part of a conversation into a short \
summary that keeps names, decisions, facts and open questions. Plain sentences, third person. \
Answer with the summary only.";

/// What a compaction did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompactionReport {
    pub compacted: bool,
    pub entries_before: usize,
    pub entries_after: usize,
    pub tokens_before: usize,
    pub tokens_after: usize,
    pub boundary_message_id: i64,
    /// The model failed and the seed's bullet list was used instead.
    pub model_fallback: bool,
}

/// A dialogue message as the summary lane's SQL returns it (`session_history.sql` here,
/// `span_messages.sql` in [`super::jobs`]).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(super) struct MessageRow {
    pub id: i64,
    pub role: String,
    pub content: String,
    pub created_at: DateTime<Utc>,
}

/// The model's summary of `entries`, or `None` when it failed.
pub fn model_summary(
    llm: &Summarizer,
    entries: &[HistoryEntry],
    max_tokens: u32,
) -> Option<String> {
    let prompt = Prompt {
        system: COMPACT_SYSTEM.into(),
        header: "Conversation:".into(),
        lines: entries
            .iter()
            .map(|e| format!("{}: {}", e.role, clip(&e.content, 400)))
            .collect(),
        footer: "Summary:".into(),
        grammar: None,
        max_tokens,
    };
    let text = llm.generate_blocking(prompt).ok()?.text;
    (!text.trim().is_empty()).then(|| text.trim().to_string())
}

/// Compacts chat session `session_id` as of `now` (Unix seconds), storing the context under
/// the same id in the ContextManager store.
pub async fn compact_session(
    svc: &SummaryService,
    session_id: &str,
    now: i64,
) -> Result<CompactionReport> {
    let llm: Arc<Summarizer> = svc.llm.clone().ok_or_else(|| {
        SummaryError::Model(
            "compaction counts tokens with the model's tokenizer; no model loaded".into(),
        )
    })?;
    let mgr = ContextManager::new(svc.pool.clone());
    let (mut ctx, boundary, ids) = read_session(svc, &mgr, session_id).await?;
    let max_tokens = svc.config.compact_max_tokens;
    let (ctx, report) = tokio::task::spawn_blocking(move || {
        ContextCompactor::count_tokens(&mut ctx, llm.engine().as_ref());
        let (entries_before, tokens_before) = (ctx.recent_history.len(), ctx.history_tokens());
        let mut fallback = false;
        let compacted = ContextCompactor::compact_with(&mut ctx, now, &mut |e| {
            model_summary(&llm, e, max_tokens).unwrap_or_else(|| {
                fallback = true;
                bullet_summary(e)
            })
        });
        let kept = ctx.recent_history.len();
        let report = CompactionReport {
            compacted,
            entries_before,
            entries_after: kept,
            tokens_before,
            tokens_after: ctx.history_tokens(),
            boundary_message_id: if kept < ids.len() {
                ids[ids.len() - kept - 1]
            } else {
                boundary
            },
            model_fallback: fallback,
        };
        (ctx, report)
    })
    .await
    .map_err(|e| SummaryError::Model(e.to_string()))?;
    mgr.save(&ctx)
        .await
        .map_err(|e| SummaryError::Invalid(e.to_string()))?;
    if report.boundary_message_id != boundary {
        sqlx::query(include_str!("../../sql/summary/compaction_put.sql"))
            .bind(session_id)
            .bind(report.boundary_message_id)
            .bind(&ctx.long_term_summary)
            .bind((report.entries_before - report.entries_after) as i32)
            .execute(&svc.pool)
            .await?;
    }
    Ok(report)
}

/// The session's context as compaction starts from it: the stored document, the summary
/// so far, and the messages after the boundary as its recent history; with the boundary
/// and those messages' ids.
async fn read_session(
    svc: &SummaryService,
    mgr: &ContextManager,
    session_id: &str,
) -> Result<(ContextData, i64, Vec<i64>)> {
    let mut ctx = mgr
        .load(session_id)
        .await
        .map_err(|e| SummaryError::Invalid(e.to_string()))?;
    let stored =
        sqlx::query_as::<_, (i64, String)>(include_str!("../../sql/summary/compaction_get.sql"))
            .bind(session_id)
            .fetch_optional(&svc.pool)
            .await?;
    let boundary = stored.as_ref().map_or(0, |(b, _)| *b);
    if let Some((_, summary)) = stored {
        ctx.long_term_summary = summary;
    }
    let rows =
        sqlx::query_as::<_, MessageRow>(include_str!("../../sql/summary/session_history.sql"))
            .bind(session_id)
            .bind(boundary)
            .fetch_all(&svc.pool)
            .await?;
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    ctx.recent_history = rows
        .into_iter()
        .map(|r| HistoryEntry {
            timestamp: r.created_at.timestamp(),
            role: r.role,
            content: r.content,
            token_count: None,
        })
        .collect();
    Ok((ctx, boundary, ids))
}
