//! A turn's exceptional events (a cold start, a quarantined snapshot), recorded by the
//! pipeline and by step 1's snapshot checks; in a file of its own so that `load.rs` does
//! not take it from `mod.rs`.

use sqlx::PgPool;
use tracing::warn;

use crate::turn::ClaimedTurn;

/// Records one of a turn's exceptional events; a failure to record is logged, not fatal.
pub(super) async fn event(
    pool: &PgPool,
    turn: &ClaimedTurn,
    kind: &str,
    detail: serde_json::Value,
) {
    let r = sqlx::query(include_str!("../../sql/turn/event.sql"))
        .bind(&turn.session_id)
        .bind(turn.id.0)
        .bind(kind)
        .bind(detail)
        .execute(pool)
        .await;
    if let Err(e) = r {
        warn!(error = %e, kind, "event not recorded");
    }
}
