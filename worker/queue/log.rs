//! Reads of `turn_log`, the rows the completion and failure transactions write, for the
//! faces: `/v1/info`'s bytes per token, the rotate hint's sizes and digest timing, the
//! demos' tables. Here so that the table is read where it is written.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::types::Result;
use crate::turn::TurnId;

/// Bytes per KV token of the latest saved snapshot (`sql/queue/recent_bpt.sql`).
pub async fn recent_bpt(pool: &PgPool) -> Result<Option<i32>> {
    Ok(
        sqlx::query_scalar(include_str!("../../sql/queue/recent_bpt.sql"))
            .fetch_optional(pool)
            .await?,
    )
}

/// The user message's tokens in `session`'s last successful turn
/// (`sql/queue/last_user_tokens.sql`).
pub async fn last_user_tokens(pool: &PgPool, session: &str) -> Result<Option<i32>> {
    Ok(
        sqlx::query_scalar(include_str!("../../sql/queue/last_user_tokens.sql"))
            .bind(session)
            .fetch_optional(pool)
            .await?,
    )
}

/// When `session`'s KV last received the digest; `None` if it never did
/// (`sql/queue/last_injected.sql`).
pub async fn last_digest_injected(pool: &PgPool, session: &str) -> Result<Option<DateTime<Utc>>> {
    Ok(
        sqlx::query_scalar(include_str!("../../sql/queue/last_injected.sql"))
            .bind(session)
            .fetch_one(pool)
            .await?,
    )
}

/// A successful turn's log line, as `demo_turn_logs.sql` returns it.
#[derive(Debug, sqlx::FromRow)]
pub struct OkTurnLog {
    pub cold: bool,
    pub digest_injected: bool,
    pub tokens_in_kv: i32,
    pub kv_bytes: i64,
    pub latency_ms: i32,
    pub ttft_ms: i32,
    pub digest_version: String,
}

/// `session`'s successful turns' log rows, in turn order (`sql/queue/demo_turn_logs.sql`).
pub async fn ok_turn_logs(pool: &PgPool, session: &str) -> Result<Vec<OkTurnLog>> {
    Ok(
        sqlx::query_as::<_, OkTurnLog>(include_str!("../../sql/queue/demo_turn_logs.sql"))
            .bind(session)
            .fetch_all(pool)
            .await?,
    )
}

/// What one turn injected (from its latest log row) and its reply, as
/// `demo_recall_turn.sql` returns it.
#[derive(Debug, sqlx::FromRow)]
pub struct TurnInjected {
    pub memory_keys: Vec<String>,
    pub m_tokens: i32,
    pub context_injected: bool,
    pub c_tokens: i32,
    pub tokens_in_kv: i32,
    pub reply: String,
}

/// What turn `id` injected and its reply; an error when it has no log row
/// (`sql/queue/demo_recall_turn.sql`).
pub async fn turn_injected(pool: &PgPool, id: TurnId) -> Result<TurnInjected> {
    Ok(
        sqlx::query_as::<_, TurnInjected>(include_str!("../../sql/queue/demo_recall_turn.sql"))
            .bind(id.0)
            .fetch_one(pool)
            .await?,
    )
}
