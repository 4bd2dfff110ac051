//! Reads of one turn or session that the faces make outside the claim-to-completion path
//! (the chat endpoint's answer and wait, the rotate hint's owner check, the demo's wait and
//! its refusal of a real queue), and the one write an answer makes: here, so that the queue's
//! tables are read and written by the queue alone.

use sqlx::PgPool;

use super::types::Result;
use crate::turn::TurnId;

/// A turn with its latest log row, as `turn_owned.sql` returns it; the log columns are
/// null while the turn has no log row.
#[derive(Debug, sqlx::FromRow)]
pub struct OwnedTurn {
    pub session_id: String,
    pub state: String,
    pub reply: Option<String>,
    pub error: Option<String>,
    pub attempts: i32,
    pub created: i64,
    pub u_tokens: Option<i32>,
    pub r_tokens: Option<i32>,
    pub cold: Option<bool>,
    pub digest_injected: Option<bool>,
    pub tokens_in_kv: Option<i32>,
    pub digest_version: Option<String>,
    pub prompt_tokens: Option<i32>,
    pub prefill_tokens: Option<i32>,
    pub finish_reason: Option<String>,
}

/// Turn `id` with its latest log row, if it belongs to `user`: another user's turn reads
/// as no turn (`sql/queue/turn_owned.sql`).
pub async fn owned_turn(pool: &PgPool, id: TurnId, user: &str) -> Result<Option<OwnedTurn>> {
    Ok(
        sqlx::query_as(include_str!("../../sql/queue/turn_owned.sql"))
            .bind(id.0)
            .bind(user)
            .fetch_optional(pool)
            .await?,
    )
}

/// Records that turn `id`'s answer is being handed to a client: an identical request after
/// this, without a retry header, is a new turn (`sql/queue/delivered.sql`).
pub async fn mark_delivered(pool: &PgPool, id: TurnId) -> Result<()> {
    sqlx::query(include_str!("../../sql/queue/delivered.sql"))
        .bind(id.0)
        .execute(pool)
        .await?;
    Ok(())
}

/// Turn `id`'s state as text; `None` once it was erased (`sql/queue/turn_state.sql`).
pub async fn turn_state(pool: &PgPool, id: TurnId) -> Result<Option<String>> {
    Ok(
        sqlx::query_scalar(include_str!("../../sql/queue/turn_state.sql"))
            .bind(id.0)
            .fetch_optional(pool)
            .await?,
    )
}

/// Turn `id`'s state, reply and error; an error when there is no such turn
/// (`sql/queue/demo_turn_state.sql`).
pub async fn turn_outcome(
    pool: &PgPool,
    id: TurnId,
) -> Result<(String, Option<String>, Option<String>)> {
    Ok(
        sqlx::query_as::<_, (String, Option<String>, Option<String>)>(include_str!(
            "../../sql/queue/demo_turn_state.sql"
        ))
        .bind(id.0)
        .fetch_one(pool)
        .await?,
    )
}

/// Who `session` belongs to: its latest turn's user and character; `None` for a session
/// with no turn (`sql/queue/session_owner.sql`).
pub async fn session_owner(pool: &PgPool, session: &str) -> Result<Option<(String, i64)>> {
    Ok(
        sqlx::query_as(include_str!("../../sql/queue/session_owner.sql"))
            .bind(session)
            .fetch_optional(pool)
            .await?,
    )
}

/// How many turns the database holds, in any state; 0 when it has no `turns` table, which
/// is asked first since a statement naming a missing table does not parse
/// (`sql/queue/demo_turns_table.sql`, then `demo_turns_held.sql`, each autocommit).
pub async fn turns_held(pool: &PgPool) -> Result<i64> {
    let has_table: bool = sqlx::query_scalar(include_str!("../../sql/queue/demo_turns_table.sql"))
        .fetch_one(pool)
        .await?;
    if !has_table {
        return Ok(0);
    }
    Ok(
        sqlx::query_scalar(include_str!("../../sql/queue/demo_turns_held.sql"))
            .fetch_one(pool)
            .await?,
    )
}

/// `session`'s committed KV dialogue: its token ids and segment table
/// (`sql/queue/demo_recall_kv.sql`); an error when the session has none.
pub async fn session_kv_tokens(pool: &PgPool, session: &str) -> Result<(Vec<i32>, String)> {
    Ok(
        sqlx::query_as::<_, (Vec<i32>, String)>(include_str!("../../sql/queue/demo_recall_kv.sql"))
            .bind(session)
            .fetch_one(pool)
            .await?,
    )
}
