//! The reaper's statements: requeue turns whose lease expired, and trim old events.

use sqlx::PgPool;

use super::types::Result;
use crate::turn::{TurnId, TurnState};

/// A turn the reaper moved out of `running`.
#[derive(Debug, Clone)]
pub struct Reaped {
    pub turn_id: TurnId,
    pub session_id: String,
    pub state: TurnState,
}

/// An expired lease as `reap.sql` returns it.
#[derive(sqlx::FromRow)]
struct Expired {
    session_id: String,
    turn_id: i64,
    fencing_token: i64,
}

/// Requeues (or kills) turns whose lease expired, and invalidates the old owners' tokens.
pub async fn reap(pool: &PgPool) -> Result<Vec<Reaped>> {
    // Scope: the expired leases found here, their turns and their release, all at once.
    let mut tx = pool.begin().await?;
    let expired: Vec<Expired> = sqlx::query_as(include_str!("../../sql/queue/reap.sql"))
        .fetch_all(&mut *tx)
        .await?;
    let mut reaped = Vec::new();
    for lease in expired {
        let Expired {
            session_id,
            turn_id,
            fencing_token: token,
        } = lease;
        let state: Option<TurnState> =
            sqlx::query_scalar(include_str!("../../sql/queue/reap_turn.sql"))
                .bind(turn_id)
                .fetch_optional(&mut *tx)
                .await?;
        sqlx::query(include_str!("../../sql/queue/reap_release.sql"))
            .bind(&session_id)
            .bind(token)
            .execute(&mut *tx)
            .await?;
        if let Some(state) = state {
            reaped.push(Reaped {
                turn_id: TurnId(turn_id),
                session_id,
                state,
            });
        }
    }
    tx.commit().await?;
    Ok(reaped)
}

/// Deletes events older than the retention window, a bounded batch at a time.
pub async fn trim_events(pool: &PgPool, retention_hours: u64) -> Result<u64> {
    let done = sqlx::query(include_str!("../../sql/queue/trim_events.sql"))
        .bind(retention_hours as f64)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}
