//! Seed 003's memory system as a library surface: `ContextData` (its JSON document, which
//! round-trips byte for byte), `ContextManager` backed by Postgres (a transaction gives the
//! atomicity the seed gets from tmp + rename), and `ContextCompactor` (history over 50
//! entries or 100k tokens folded into `long_term_summary`, fact dedup, task pruning).
//! Token counts come from the model's tokenizer; summaries from the model when one is
//! given, else the seed's own bullet list.

use std::path::Path;

use chrono::Utc;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;

use crate::context::tokens::TokenCount;

/// Seed 003: compact when `recent_history` is longer than this...
pub const MAX_RECENT_HISTORY: usize = 50;
/// ...keeping this many of the newest entries.
pub const KEEP_RECENT: usize = 30;
/// Seed 003: compact the oldest half when the history holds more tokens than this.
pub const MAX_TOKENS: usize = 100_000;
/// Completed tasks are kept this long (seconds).
pub const COMPLETED_TASK_TTL_S: i64 = 86_400;

#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid session id: {0}")]
    InvalidSession(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct SystemState {
    pub last_workspace: Option<String>,
    #[serde(default)]
    pub preferences: IndexMap<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    #[serde(default)]
    pub timestamp: i64,
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_count: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskStatus {
    Pending,
    Running,
    Completed,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub description: String,
    pub status: TaskStatus,
    pub progress: f64,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ToolStats {
    pub total_calls: u64,
    #[serde(default)]
    pub by_tool: IndexMap<String, u64>,
    pub failures: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Environment {
    pub workspace: Option<String>,
    pub last_update: i64,
    #[serde(default)]
    pub system_snapshot: IndexMap<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct TokenUsage {
    pub total_input: u64,
    pub total_output: u64,
    pub by_session: u64,
}

/// Seed 003's context document, field for field and in its order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextData {
    pub session_id: String,
    #[serde(default)]
    pub system_state: SystemState,
    #[serde(default)]
    pub facts: Vec<String>,
    #[serde(default)]
    pub recent_history: Vec<HistoryEntry>,
    #[serde(default)]
    pub long_term_summary: String,
    #[serde(default)]
    pub active_tasks: Vec<Task>,
    #[serde(default)]
    pub tool_stats: ToolStats,
    #[serde(default)]
    pub last_known_environment: Environment,
    #[serde(default)]
    pub token_usage: TokenUsage,
}

impl ContextData {
    pub fn new(session_id: &str) -> ContextData {
        ContextData {
            session_id: session_id.to_string(),
            system_state: SystemState::default(),
            facts: Vec::new(),
            recent_history: Vec::new(),
            long_term_summary: String::new(),
            active_tasks: Vec::new(),
            tool_stats: ToolStats::default(),
            last_known_environment: Environment::default(),
            token_usage: TokenUsage::default(),
        }
    }

    /// The document as seed 003 prints it: two-space indent, the seed's key order, and a
    /// final newline, as a file has.
    pub fn to_json(&self) -> Result<String, ContextError> {
        Ok(serde_json::to_string_pretty(self)? + "\n")
    }

    pub fn from_json(text: &str) -> Result<ContextData, ContextError> {
        Ok(serde_json::from_str(text)?)
    }

    /// Tokens in `recent_history` (entries without a count count zero; see
    /// [`ContextCompactor::count_tokens`]).
    pub fn history_tokens(&self) -> usize {
        self.recent_history
            .iter()
            .filter_map(|e| e.token_count)
            .sum()
    }
}

/// Seed 003's `ContextManager`, on Postgres (`contexts`).
#[derive(Clone)]
pub struct ContextManager {
    pool: PgPool,
}

impl ContextManager {
    pub fn new(pool: PgPool) -> ContextManager {
        ContextManager { pool }
    }

    /// Seed 003 creates its directory here; the table comes from the migrations, so this
    /// checks that it is there.
    pub async fn initialize(&self) -> Result<(), ContextError> {
        sqlx::query(include_str!("../../sql/summary/ctx_check.sql"))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Loads a context, creating (and saving) an empty one when it does not exist.
    pub async fn load(&self, session_id: &str) -> Result<ContextData, ContextError> {
        check_id(session_id)?;
        let stored: Option<String> =
            sqlx::query_scalar(include_str!("../../sql/summary/ctx_get.sql"))
                .bind(session_id)
                .fetch_optional(&self.pool)
                .await?;
        match stored {
            Some(text) => ContextData::from_json(&text),
            None => {
                let ctx = ContextData::new(session_id);
                self.save(&ctx).await?;
                Ok(ctx)
            }
        }
    }

    /// Saves a context atomically: one statement, one transaction.
    pub async fn save(&self, context: &ContextData) -> Result<(), ContextError> {
        check_id(&context.session_id)?;
        self.save_text(&context.session_id, &context.to_json()?)
            .await
    }

    async fn save_text(&self, session_id: &str, text: &str) -> Result<(), ContextError> {
        sqlx::query(include_str!("../../sql/summary/ctx_put.sql"))
            .bind(session_id)
            .bind(text)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn delete(&self, session_id: &str) -> Result<(), ContextError> {
        sqlx::query(include_str!("../../sql/summary/ctx_delete.sql"))
            .bind(session_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn list_sessions(&self) -> Result<Vec<String>, ContextError> {
        Ok(
            sqlx::query_scalar(include_str!("../../sql/summary/ctx_list.sql"))
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// The stored document, exactly as saved.
    pub async fn export_text(&self, session_id: &str) -> Result<Option<String>, ContextError> {
        Ok(
            sqlx::query_scalar(include_str!("../../sql/summary/ctx_get.sql"))
                .bind(session_id)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Writes the stored document to `path` (tmp, then rename, as seed 003 does).
    pub async fn export(&self, session_id: &str, path: &Path) -> Result<bool, ContextError> {
        let Some(text) = self.export_text(session_id).await? else {
            return Ok(false);
        };
        let tmp = path.with_extension("tmp");
        tokio::fs::write(&tmp, text.as_bytes()).await?;
        tokio::fs::rename(&tmp, path).await?;
        Ok(true)
    }

    /// Reads a document from `path`, checks it parses as a context, and stores its text as
    /// is. Returns its session id.
    pub async fn import(&self, path: &Path) -> Result<String, ContextError> {
        let text = tokio::fs::read_to_string(path).await?;
        let ctx = ContextData::from_json(&text)?;
        check_id(&ctx.session_id)?;
        self.save_text(&ctx.session_id, &text).await?;
        Ok(ctx.session_id)
    }
}

fn check_id(id: &str) -> Result<(), ContextError> {
    if id.trim().is_empty() || id.len() > 512 || id.chars().any(char::is_control) {
        return Err(ContextError::InvalidSession(id.chars().take(64).collect()));
    }
    Ok(())
}

/// Seed 003's bullet summary: "Previous conversation summary:\n- role: content" per entry.
pub fn bullet_summary(entries: &[HistoryEntry]) -> String {
    let mut s = String::from("Previous conversation summary:");
    for e in entries {
        s.push_str(&format!("\n- {}: {}", e.role, e.content));
    }
    s
}

/// Seed 003's compactor.
pub struct ContextCompactor;

impl ContextCompactor {
    /// Seed 003's signature: compacts with the seed's bullet summary at the current time;
    /// true if anything changed.
    pub fn compact(context: &mut ContextData) -> bool {
        Self::compact_with(
            context,
            Utc::now().timestamp(),
            &mut |e: &[HistoryEntry]| bullet_summary(e),
        )
    }

    /// Compacts at `now` (Unix seconds) with `summarize` turning the removed entries into
    /// text (the model, in the summary lane). Order as seed 003: length, tokens, fact
    /// dedup, task pruning.
    pub fn compact_with(
        context: &mut ContextData,
        now: i64,
        summarize: &mut dyn FnMut(&[HistoryEntry]) -> String,
    ) -> bool {
        let mut changed = false;
        let len = context.recent_history.len();
        if len > MAX_RECENT_HISTORY {
            fold(context, len - KEEP_RECENT, summarize);
            changed = true;
        }
        if context.history_tokens() > MAX_TOKENS {
            let half = context.recent_history.len() / 2;
            if half > 0 {
                fold(context, half, summarize);
                changed = true;
            }
        }
        changed |= Self::dedup_facts(context);
        changed |= Self::prune_tasks(context, now);
        changed
    }

    /// Fills missing token counts with the model's tokenizer; returns how many it filled.
    pub fn count_tokens(context: &mut ContextData, tokens: &dyn TokenCount) -> usize {
        let mut n = 0;
        for e in context
            .recent_history
            .iter_mut()
            .filter(|e| e.token_count.is_none())
        {
            e.token_count = Some(tokens.count(&e.content));
            n += 1;
        }
        n
    }

    /// Seed 003: sort the facts, remove duplicates.
    pub fn dedup_facts(context: &mut ContextData) -> bool {
        let before = context.facts.clone();
        context.facts.sort();
        context.facts.dedup();
        context.facts != before
    }

    /// Seed 003: keep running tasks, keep completed tasks younger than 24 h, drop older
    /// completed ones. Other states are kept.
    pub fn prune_tasks(context: &mut ContextData, now: i64) -> bool {
        let cutoff = now - COMPLETED_TASK_TTL_S;
        let before = context.active_tasks.len();
        context
            .active_tasks
            .retain(|t| t.status != TaskStatus::Completed || t.updated_at > cutoff);
        context.active_tasks.len() != before
    }
}

fn fold(context: &mut ContextData, n: usize, summarize: &mut dyn FnMut(&[HistoryEntry]) -> String) {
    let old: Vec<HistoryEntry> = context.recent_history.drain(..n).collect();
    let summary = summarize(&old);
    if context.long_term_summary.is_empty() {
        context.long_term_summary = summary;
    } else {
        context.long_term_summary = format!("{}\n{}", context.long_term_summary, summary);
    }
}
