//! Summaries exist so a character keeps the gist of everything it was told, not only the
//! KV tail: seed 001's sessions, rolling summaries, session summaries and spine, seed 004's
//! daily and days 2–7 summaries with a 3-way merge and caches, and seed 003's context store
//! and compactor. Every summary is made by the configured model through llama.cpp, as a job
//! on the Postgres summary lane, off the turn's critical path.
//!
//! Layout: [`llm`] (the model on its own thread), [`schema`] (seed 001's session-summary
//! JSON, its grammar and validation), [`jobs`] (the lane: close, rolling, session, spine),
//! [`spine`], [`daily`] (daily, historical, merge, degradation), [`cache`] (moka caches and
//! their hit counters), [`context_manager`] (seed 003's API and compactor),
//! [`session_context`] (what a new session starts from), [`report`] (what `kvmem summary`
//! and `kvmem status` read, and the rebuild's jobs), [`demo`] (what the demo's scenes set
//! and read); the `kvmem summary` command is [`crate::cmd::summary`].

pub mod cache;
pub mod compaction;
pub mod context_manager;
pub mod daily;
mod daily_prompt;
pub mod demo;
pub mod jobs;
pub mod llm;
pub mod report;
pub mod schema;
pub mod session_context;
pub mod spine;

use std::path::PathBuf;
use std::sync::Arc;

use sqlx::PgPool;

use crate::config::Settings;

/// Errors of the summary layer. Model failures are a variant of their own: callers degrade
/// on them (seed 004) instead of failing.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("model: {0}")]
    Model(String),
    #[error("invalid: {0}")]
    Invalid(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

pub type Result<T, E = SummaryError> = std::result::Result<T, E>;

/// Summary settings, from [`Settings`].
#[derive(Debug, Clone)]
pub struct SummaryConfig {
    /// The model file; `None` means no model (every model call fails and callers degrade).
    pub model_path: Option<PathBuf>,
    pub max_attempts: u32,
    pub cache_capacity: u64,
    /// Token budgets per summary kind.
    pub rolling_max_tokens: u32,
    pub session_max_tokens: u32,
    pub spine_max_tokens: u32,
    pub daily_max_tokens_per_user: u32,
    pub historical_max_tokens: u32,
    pub merge_max_tokens: u32,
    pub compact_max_tokens: u32,
}

impl SummaryConfig {
    pub fn from_settings(s: &Settings) -> SummaryConfig {
        SummaryConfig {
            model_path: s
                .summary
                .model_path
                .clone()
                .or_else(|| s.engine.model_path.clone()),
            max_attempts: s.summary.max_attempts.max(1),
            cache_capacity: s.summary.cache_capacity.max(1),
            rolling_max_tokens: 160,
            session_max_tokens: 480,
            spine_max_tokens: 420,
            daily_max_tokens_per_user: 100,
            historical_max_tokens: 160,
            merge_max_tokens: 220,
            compact_max_tokens: 200,
        }
    }
}

/// What summary work needs at run time: the pool, the model when it loaded, and the caches.
#[derive(Clone)]
pub struct SummaryService {
    pub pool: PgPool,
    pub config: SummaryConfig,
    pub llm: Option<Arc<llm::Summarizer>>,
    pub caches: Arc<cache::Caches>,
}

impl SummaryService {
    /// The model, or the reason there is none.
    pub fn model(&self) -> Result<&llm::Summarizer> {
        self.llm
            .as_deref()
            .ok_or_else(|| SummaryError::Model("no summary model loaded".into()))
    }
}

/// Records summary progress or failure in `events`, where `kvmem status` shows it. Best
/// effort: a failure to record is logged, never raised.
pub async fn event(pool: &PgPool, kind: &str, detail: serde_json::Value) {
    let res = sqlx::query(include_str!("../../sql/summary/event.sql"))
        .bind(kind)
        .bind(&detail)
        .execute(pool)
        .await;
    if let Err(e) = res {
        tracing::warn!(kind, error = %e, "could not record summary event");
    }
}

/// Cuts `text` to at most `max` characters, at the last sentence end if one falls in the
/// second half, else at the last word boundary.
pub fn clip(text: &str, max: usize) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.chars().count() <= max {
        return text;
    }
    let cut: String = text.chars().take(max).collect();
    let half = max / 2;
    if let Some(i) = cut.rfind(['.', '!', '?']).filter(|&i| i >= half) {
        return cut[..=i].to_string();
    }
    match cut.rfind(' ') {
        Some(i) if i > 0 => cut[..i].trim_end().to_string(),
        _ => cut,
    }
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn clip_prefers_sentence_then_word_boundaries() {
        assert_eq!(clip("short  text", 600), "short text");
        assert_eq!(
            clip("One two. Three four five six", 20),
            "One two. Three four"
        );
        assert_eq!(clip("Alpha beta. Gamma delta epsilon.", 14), "Alpha beta.");
        assert!(clip(&"word ".repeat(300), 600).chars().count() <= 600);
    }
}
