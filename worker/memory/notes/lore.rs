//! Seed 002's memory lines: a character's reply may ask to keep one line about the shared
//! story (the worker cuts it off the reply, `pipeline::memory_line`). The lane stores it
//! under the lore subject like any memory, after the same injection and grounding filters
//! as extracted facts, so a model cannot write instructions into its own memory.

use serde_json::json;

use crate::memory::error::Result;
use crate::memory::events::event;
use crate::memory::job::job_text;
use crate::memory::service::MemoryService;
use crate::memory::store::filters::{check_fact, Verdict};
use crate::memory::store::{self, FactType, Kind, NewMemory, Scope, Source};

/// Seed 002's confidence for a memory line.
pub const LINE_CONFIDENCE: f32 = 0.72;

/// Runs a `line` job: screens the line, grounds it in the turn's exchange (the user's
/// message and the stored reply), and stores `Memory line: <line>.` for the character.
pub async fn remember_line(
    svc: &MemoryService,
    scope: &Scope,
    payload: &serde_json::Value,
) -> Result<serde_json::Value> {
    let line = job_text(payload, "line")?;
    let message_id = payload["message_id"].as_str().unwrap_or_default();
    let source: Option<String> =
        sqlx::query_scalar(include_str!("../../../sql/memory/turn_exchange.sql"))
            .bind(&scope.user_id)
            .bind(message_id)
            .fetch_one(&svc.pool)
            .await?;
    let Some(source) = source else {
        return Ok(json!({"stored": false, "reason": "the turn's messages are gone"}));
    };
    let line = match check_fact(line, "lore", None, &source) {
        Verdict::Accepted(c) => c.text,
        Verdict::Rejected(reason) => {
            let why = reason.filter();
            event(&svc.pool, "memory_line_rejected", why, Some(&scope.user_id)).await;
            return Ok(json!({"stored": false, "reason": why}));
        }
    };
    let text = format!("Memory line: {}.", line.trim_end_matches(['.', '!', '?']));
    let mut m = NewMemory::new(
        &scope.user_id,
        Kind::Project,
        FactType::Lore,
        &text,
        Source::Lore,
    );
    m.character_id = scope.character_id;
    m.confidence = LINE_CONFIDENCE;
    m.source_message_ids = vec![message_id.to_string()];
    svc.embed_memory(&mut m).await;
    let up = store::upsert(&svc.pool, m).await?;
    // Seed 002: the newest 120 lines per lore subject.
    store::archive_keep(
        &svc.pool,
        &scope.user_id,
        svc.config.keep_user,
        svc.config.keep_lore,
    )
    .await?;
    Ok(json!({"stored": true, "memory_id": up.id(), "text": text}))
}
