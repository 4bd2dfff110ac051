//! What a batch replay reads of the turns it re-runs and of their replays: the recorded
//! turns with how each one's KV started, how many replayed turns have ended, and each
//! replay's outcome. The comparison itself is the command's (`cmd::replay`).

use sqlx::PgPool;

use super::types::Result;
use crate::turn::TurnId;

/// How a turn's KV started, from its latest OK log row; all null when it has none.
#[derive(Debug, sqlx::FromRow)]
pub struct LogStart {
    pub cold: Option<bool>,
    pub cold_reason: Option<String>,
    pub rebuild: Option<String>,
}

/// A recorded turn, as `replay_source_turns.sql` returns it.
#[derive(Debug, sqlx::FromRow)]
pub struct SourceTurn {
    pub user_id: String,
    pub character_id: i64,
    pub message: String,
    pub reply: Option<String>,
    #[sqlx(flatten)]
    pub start: LogStart,
}

/// `session`'s done turns, in order, each with how its KV started
/// (`sql/queue/replay_source_turns.sql`).
pub async fn source_turns(pool: &PgPool, session: &str) -> Result<Vec<SourceTurn>> {
    Ok(
        sqlx::query_as::<_, SourceTurn>(include_str!("../../sql/queue/replay_source_turns.sql"))
            .bind(session)
            .fetch_all(pool)
            .await?,
    )
}

/// How many of the turns `ids` have ended: done, failed or dead
/// (`sql/queue/replay_finished.sql`).
pub async fn finished_count(pool: &PgPool, ids: &[i64]) -> Result<i64> {
    Ok(
        sqlx::query_scalar(include_str!("../../sql/queue/replay_finished.sql"))
            .bind(ids)
            .fetch_one(pool)
            .await?,
    )
}

/// A replayed turn's outcome, as `replay_turn_result.sql` returns it.
#[derive(Debug, sqlx::FromRow)]
pub struct ReplayedTurn {
    pub state: String,
    pub reply: Option<String>,
    pub latency_ms: Option<i32>,
    #[sqlx(flatten)]
    pub start: LogStart,
}

/// Turn `id`'s state and reply with its latest OK log row; an error when there is no such
/// turn (`sql/queue/replay_turn_result.sql`).
pub async fn replayed_turn(pool: &PgPool, id: TurnId) -> Result<ReplayedTurn> {
    Ok(
        sqlx::query_as::<_, ReplayedTurn>(include_str!("../../sql/queue/replay_turn_result.sql"))
            .bind(id.0)
            .fetch_one(pool)
            .await?,
    )
}
