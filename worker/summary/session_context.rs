//! What a new session starts from, in one read: seed 001 hands the next session the latest
//! session summary and the rolling summary, and the user's spine. Backends fetch it over
//! HTTP (`/v1/memory/summary`), operators with `kvmem summary show`, SQL with the
//! `kvmem_session_context` view.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;

use super::{Result, SummaryError};

/// One user and character's summaries, as a new session gets them.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct SessionContext {
    /// Not columns of the read: the caller's own arguments, set after it.
    #[sqlx(skip)]
    pub user_id: String,
    #[sqlx(skip)]
    pub character_id: i64,
    pub rolling_summary: String,
    /// The newest valid session summary (seed 001's JSON) and the session it closed.
    pub latest_session_summary: Option<Value>,
    pub latest_session_id: Option<i64>,
    pub latest_session_ended_at: Option<DateTime<Utc>>,
    pub spine_version: Option<i32>,
    pub spine: Option<String>,
    pub open_session_id: Option<i64>,
    pub open_session_started_at: Option<DateTime<Utc>>,
}

/// The context of `user` with `character`. Both filter, so another user's character id
/// finds nothing: `NotFound`, never that user's summaries.
pub async fn load(pool: &PgPool, user: &str, character: i64) -> Result<SessionContext> {
    if user.trim().is_empty() {
        return Err(SummaryError::Invalid("user must not be blank".into()));
    }
    let mut ctx: SessionContext =
        sqlx::query_as(include_str!("../../sql/summary/session_context.sql"))
            .bind(user)
            .bind(character)
            .fetch_optional(pool)
            .await?
            .ok_or_else(|| {
                SummaryError::NotFound(format!(
                    "no summaries for user {user} and character {character}"
                ))
            })?;
    ctx.user_id = user.to_string();
    ctx.character_id = character;
    Ok(ctx)
}
