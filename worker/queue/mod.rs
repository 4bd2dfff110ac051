//! The turn queue in Postgres: claim with a per-session lease, heartbeat, fenced
//! completion, retry or death, and the reaper. Every statement lives in `sql/queue/`.

use std::collections::HashSet;

use sqlx::{PgPool, Postgres, Row, Transaction};

use crate::turn::log::KvLog;
pub use crate::turn::{ClaimedTurn, TurnId, TurnState};

/// Channel the enqueue function notifies, payload = session id.
pub const TURNS_CHANNEL: &str = "kvmem_turns";
/// Channel announcing finished turns, payload = JSON `{turn_id, session_id, state}`.
pub const TURN_DONE_CHANNEL: &str = "kvmem_turn_done";

/// Queue errors. `Fenced` means another worker owns the session now: drop the work.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("lease lost for turn {0}: another worker owns the session now")]
    Fenced(TurnId),
    #[error("the worker's commit queue has stopped")]
    Stopped,
}

pub type Result<T, E = QueueError> = std::result::Result<T, E>;

/// Lease and backoff settings, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct QueueTiming {
    pub lease_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
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
    let mut claimed = Vec::new();
    for lane in lanes {
        let left = max.saturating_sub(claimed.len() as u32);
        if left == 0 {
            break;
        }
        let rows = sqlx::query(include_str!("../../sql/queue/claim.sql"))
            .bind(owner)
            .bind(lease_ms as f64)
            .bind(std::slice::from_ref(lane))
            .bind(left as i64)
            .fetch_all(pool)
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            // The unique index refused a second running turn in a session: nothing claimed.
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => continue,
            Err(e) => return Err(e.into()),
        };
        for row in rows {
            claimed.push(ClaimedTurn {
                id: TurnId(row.try_get("id")?),
                session_id: row.try_get("session_id")?,
                user_id: row.try_get("user_id")?,
                character_id: row.try_get("character_id")?,
                message: row.try_get("message")?,
                lane: row.try_get("lane")?,
                attempt: row.try_get("attempts")?,
                max_attempts: row.try_get("max_attempts")?,
                fencing_token: row.try_get("fencing_token")?,
                owner: owner.to_string(),
            });
        }
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

/// The session's last committed turn and the fencing token of its committing attempt.
pub async fn last_done(pool: &PgPool, session_id: &str) -> Result<Option<(i64, Option<i64>)>> {
    let row = sqlx::query_as(include_str!("../../sql/turn/last_done.sql"))
        .bind(session_id)
        .fetch_optional(pool)
        .await?;
    Ok(row)
}

/// Locks the lease row and checks this worker still holds it.
async fn fence(tx: &mut Transaction<'_, Postgres>, turn: &ClaimedTurn) -> Result<()> {
    let held = sqlx::query(include_str!("../../sql/queue/fence.sql"))
        .bind(&turn.session_id)
        .bind(turn.fencing_token)
        .bind(&turn.owner)
        .bind(turn.id.0)
        .fetch_optional(&mut **tx)
        .await?;
    match held {
        Some(_) => Ok(()),
        None => Err(QueueError::Fenced(turn.id)),
    }
}

/// A finished turn waiting to be committed.
#[derive(Debug, Clone)]
pub struct Completion {
    pub turn: ClaimedTurn,
    pub reply: String,
    pub log: KvLog,
}

/// Writes the reply, the dialogue rows, the log row and frees the lease: all or nothing.
pub async fn complete(pool: &PgPool, turn: &ClaimedTurn, reply: &str, log: &KvLog) -> Result<()> {
    let batch = [Completion {
        turn: turn.clone(),
        reply: reply.to_string(),
        log: log.clone(),
    }];
    let mut done = complete_many(pool, &batch).await?;
    done.pop().unwrap_or(Err(QueueError::Fenced(turn.id)))
}

/// Commits a batch of completions in one transaction (group commit): one WAL flush and a
/// handful of set-based statements for the whole batch. Each turn is still fenced on its
/// own: a turn whose lease was lost gets `Err(Fenced)` and writes nothing, the others
/// commit. The result has one entry per input, in order. `Err` for the call as a whole
/// means nothing was committed.
pub async fn complete_many(pool: &PgPool, batch: &[Completion]) -> Result<Vec<Result<()>>> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    // The lease keys go to the fence and the release; only complete.sql needs the texts,
    // so the messages and replies cross the wire once.
    let keys = serde_json::Value::Array(
        batch
            .iter()
            .map(|c| {
                serde_json::json!({
                    "turn_id": c.turn.id.0,
                    "session_id": c.turn.session_id,
                    "fencing_token": c.turn.fencing_token,
                    "owner": c.turn.owner,
                })
            })
            .collect(),
    );
    let texts = serde_json::Value::Array(
        batch
            .iter()
            .map(|c| {
                serde_json::json!({
                    "turn_id": c.turn.id.0,
                    "session_id": c.turn.session_id,
                    "fencing_token": c.turn.fencing_token,
                    "message": c.turn.message,
                    "reply": c.reply,
                })
            })
            .collect(),
    );
    // Scope: every completion of the batch, each guarded by its own fencing token.
    let mut tx = pool.begin().await?;
    let held: Vec<i64> = sqlx::query_scalar(include_str!("../../sql/queue/fence_many.sql"))
        .bind(&keys)
        .fetch_all(&mut *tx)
        .await?;
    let done: HashSet<i64> = if held.is_empty() {
        Default::default()
    } else {
        let ids: Vec<i64> = sqlx::query_scalar(include_str!("../../sql/queue/complete.sql"))
            .bind(&texts)
            .bind(&held)
            .fetch_all(&mut *tx)
            .await?;
        ids.into_iter().collect()
    };
    if !done.is_empty() {
        let rows = batch
            .iter()
            .filter(|c| done.contains(&c.turn.id.0))
            .map(|c| c.log.row(&c.turn))
            .collect();
        insert_log_rows(&mut tx, rows).await?;
        sqlx::query(include_str!("../../sql/queue/release_many.sql"))
            .bind(&keys)
            .bind(done.iter().copied().collect::<Vec<i64>>())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(batch
        .iter()
        .map(|c| {
            if done.contains(&c.turn.id.0) {
                Ok(())
            } else {
                Err(QueueError::Fenced(c.turn.id))
            }
        })
        .collect())
}

/// Records a failed attempt: back to the queue with backoff, or `failed`/`dead`.
pub async fn fail(
    pool: &PgPool,
    turn: &ClaimedTurn,
    error: &str,
    retryable: bool,
    timing: QueueTiming,
    log: &KvLog,
) -> Result<TurnState> {
    // Scope: the failed attempt's state change, its log row and the lease release.
    let mut tx = pool.begin().await?;
    fence(&mut tx, turn).await?;
    let row = sqlx::query(include_str!("../../sql/queue/fail.sql"))
        .bind(turn.id.0)
        .bind(error)
        .bind(retryable)
        .bind(timing.backoff_base_ms as f64)
        .bind(timing.backoff_max_ms as f64)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(row) = row else {
        return Err(QueueError::Fenced(turn.id));
    };
    let state: TurnState = row.try_get("state")?;
    insert_log_rows(&mut tx, vec![log.row(turn)]).await?;
    release_lease(&mut tx, turn).await?;
    if state != TurnState::Queued {
        notify_done(&mut tx, turn, state).await?;
    }
    tx.commit().await?;
    Ok(state)
}

/// Gives a claimed turn back without counting the attempt (graceful shutdown).
pub async fn release(pool: &PgPool, turn: &ClaimedTurn) -> Result<bool> {
    // Scope: the turn's return to the queue and the lease release, guarded by the token.
    let mut tx = pool.begin().await?;
    fence(&mut tx, turn).await?;
    let row = sqlx::query(include_str!("../../sql/queue/release.sql"))
        .bind(turn.id.0)
        .fetch_optional(&mut *tx)
        .await?;
    release_lease(&mut tx, turn).await?;
    tx.commit().await?;
    Ok(row.is_some())
}

/// A turn the reaper moved out of `running`.
#[derive(Debug, Clone)]
pub struct Reaped {
    pub turn_id: TurnId,
    pub session_id: String,
    pub state: TurnState,
}

/// Requeues (or kills) turns whose lease expired, and invalidates the old owners' tokens.
pub async fn reap(pool: &PgPool) -> Result<Vec<Reaped>> {
    // Scope: the expired leases found here, their turns and their release, all at once.
    let mut tx = pool.begin().await?;
    let expired = sqlx::query(include_str!("../../sql/queue/reap.sql"))
        .fetch_all(&mut *tx)
        .await?;
    let mut reaped = Vec::new();
    for lease in expired {
        let session_id: String = lease.try_get("session_id")?;
        let turn_id: i64 = lease.try_get("turn_id")?;
        let token: i64 = lease.try_get("fencing_token")?;
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

async fn release_lease(tx: &mut Transaction<'_, Postgres>, turn: &ClaimedTurn) -> Result<()> {
    sqlx::query(include_str!("../../sql/queue/release_lease.sql"))
        .bind(&turn.session_id)
        .bind(turn.fencing_token)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn notify_done(
    tx: &mut Transaction<'_, Postgres>,
    turn: &ClaimedTurn,
    state: TurnState,
) -> Result<()> {
    let payload = serde_json::json!({
        "turn_id": turn.id.0,
        "session_id": turn.session_id,
        "state": state,
    });
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(TURN_DONE_CHANNEL)
        .bind(payload.to_string())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Enqueues through the backend's SQL function, exactly as a backend would.
pub async fn enqueue(
    pool: &PgPool,
    session_id: &str,
    user_id: &str,
    character_id: i64,
    message: &str,
    idempotency_key: Option<&str>,
) -> Result<TurnId> {
    enqueue_on(
        pool,
        session_id,
        user_id,
        character_id,
        message,
        idempotency_key,
        "live",
    )
    .await
}

/// [`enqueue`] on a given lane (`live` or `replay`).
pub async fn enqueue_on(
    pool: &PgPool,
    session_id: &str,
    user_id: &str,
    character_id: i64,
    message: &str,
    idempotency_key: Option<&str>,
    lane: &str,
) -> Result<TurnId> {
    let id: i64 = sqlx::query_scalar("SELECT kvmem_enqueue_turn($1, $2, $3, $4, $5, $6)")
        .bind(session_id)
        .bind(user_id)
        .bind(character_id)
        .bind(message)
        .bind(idempotency_key)
        .bind(lane)
        .fetch_one(pool)
        .await?;
    Ok(TurnId(id))
}

/// Inserts `turn_log` rows made by [`KvLog::row`], inside the transaction that records the
/// attempt's outcome.
async fn insert_log_rows(
    tx: &mut Transaction<'_, Postgres>,
    rows: Vec<serde_json::Value>,
) -> Result<(), sqlx::Error> {
    sqlx::query(include_str!("../../sql/turn/insert_log.sql"))
        .bind(serde_json::Value::Array(rows))
        .execute(&mut **tx)
        .await?;
    Ok(())
}
