//! Claiming turns under a per-session lease (each with its session's last committed turn),
//! keeping the lease alive, and the check a running turn makes against it (is it still ours).

use sqlx::PgPool;

use futures_util::future::BoxFuture;

use super::types::{QueueError, Result};
use crate::turn::{ClaimedTurn, LeaseCheck, TurnId};

/// A turn as `claim_lease.sql` returns it; the owner is not a column, so the row is
/// turned into a [`ClaimedTurn`] here rather than decoded into one.
#[derive(sqlx::FromRow)]
struct ClaimRow {
    id: i64,
    session_id: String,
    user_id: String,
    character_id: i64,
    message: String,
    options: Option<sqlx::types::Json<serde_json::Value>>,
    lane: String,
    attempts: i32,
    max_attempts: i32,
    fencing_token: i64,
    last_done_id: Option<i64>,
    last_done_token: Option<i64>,
}

impl ClaimRow {
    fn claimed(self, owner: &str) -> ClaimedTurn {
        ClaimedTurn {
            id: TurnId(self.id),
            session_id: self.session_id,
            user_id: self.user_id,
            character_id: self.character_id,
            message: self.message,
            options: self.options.map(|o| o.0),
            lane: self.lane,
            attempt: self.attempts,
            max_attempts: self.max_attempts,
            fencing_token: self.fencing_token,
            owner: owner.to_string(),
            last_done: self.last_done_id.map(|id| (id, self.last_done_token)),
        }
    }
}

/// Claims the oldest runnable turn of any free session. `lanes` are tried in order, so
/// an earlier lane (live) always wins over a later one (replay): replay never starves live.
pub async fn claim(
    pool: &PgPool,
    owner: &str,
    lease_ms: u64,
    lanes: &[String],
) -> Result<Option<ClaimedTurn>> {
    Ok(claim_up_to(pool, owner, lease_ms, lanes, 1).await?.pop())
}

/// Claims up to `max` runnable turns, each from a different session, one statement per
/// lane, filling from the lanes in order (live before replay).
pub async fn claim_up_to(
    pool: &PgPool,
    owner: &str,
    lease_ms: u64,
    lanes: &[String],
    max: u32,
) -> Result<Vec<ClaimedTurn>> {
    claim_preferring(pool, owner, lease_ms, lanes, max, None).await
}

/// [`claim_up_to`], with claim affinity when `affinity` is set: sessions whose last turn
/// `owner` ran come first, and another worker's sessions are left to it until they have
/// been ready for the `affinity` wait (`sql/queue/claim_next_affinity.sql`).
pub async fn claim_preferring(
    pool: &PgPool,
    owner: &str,
    lease_ms: u64,
    lanes: &[String],
    max: u32,
    affinity: Option<std::time::Duration>,
) -> Result<Vec<ClaimedTurn>> {
    const PLAIN: &str = concat!(
        include_str!("../../sql/queue/claim_next.sql"),
        include_str!("../../sql/queue/claim_lease.sql")
    );
    const PREFERRING: &str = concat!(
        include_str!("../../sql/queue/claim_next_affinity.sql"),
        include_str!("../../sql/queue/claim_lease.sql")
    );
    let mut claimed = Vec::new();
    for lane in lanes {
        let left = max.saturating_sub(claimed.len() as u32);
        if left == 0 {
            break;
        }
        let query = match affinity {
            None => sqlx::query_as::<_, ClaimRow>(PLAIN),
            Some(_) => sqlx::query_as::<_, ClaimRow>(PREFERRING),
        };
        let mut query = query
            .bind(owner)
            .bind(lease_ms as f64)
            .bind(std::slice::from_ref(lane))
            .bind(left as i64);
        if let Some(wait) = affinity {
            query = query.bind(wait.as_millis() as f64);
        }
        let rows = query.fetch_all(pool).await;
        let rows = match rows {
            Ok(rows) => rows,
            // The unique index refused a second running turn in a session: nothing claimed.
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => continue,
            Err(e) => return Err(e.into()),
        };
        claimed.extend(rows.into_iter().map(|row| row.claimed(owner)));
    }
    Ok(claimed)
}

/// Extends the lease. `Ok(false)` means it was lost.
pub async fn heartbeat(pool: &PgPool, turn: &ClaimedTurn, lease_ms: u64) -> Result<bool> {
    let row = sqlx::query(include_str!("../../sql/queue/heartbeat.sql"))
        .bind(&turn.session_id)
        .bind(turn.fencing_token)
        .bind(&turn.owner)
        .bind(lease_ms as f64)
        .fetch_optional(pool)
        .await?;
    Ok(row.is_some())
}

/// True while this worker still holds the turn's unexpired lease.
pub async fn lease_held(pool: &PgPool, turn: &ClaimedTurn) -> Result<bool> {
    let held = sqlx::query_scalar(include_str!("../../sql/queue/lease_held.sql"))
        .bind(&turn.session_id)
        .bind(turn.id.0)
        .bind(&turn.owner)
        .bind(turn.fencing_token)
        .fetch_one(pool)
        .await?;
    Ok(held)
}

/// The queue's answer to a running turn's [`LeaseCheck`]: [`lease_held`] for that turn.
pub struct SessionLease {
    pool: PgPool,
    turn: ClaimedTurn,
}

impl SessionLease {
    pub fn new(pool: PgPool, turn: ClaimedTurn) -> SessionLease {
        SessionLease { pool, turn }
    }
}

impl LeaseCheck for SessionLease {
    fn held(&self) -> BoxFuture<'_, std::result::Result<bool, sqlx::Error>> {
        Box::pin(async move {
            lease_held(&self.pool, &self.turn)
                .await
                .map_err(QueueError::into_db)
        })
    }
}
