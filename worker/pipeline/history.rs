//! The cold path's dialogue: what a turn re-reads from `messages` when no snapshot can be
//! trusted, and how it is laid back into an empty KV within the tail budget.

use sqlx::{PgPool, Row};

use crate::engine::{Engine, EngineError, KvSession};
use crate::snapshot::SegKind;

/// How many recent exchanges a cold start reads back (bounded again by the tail).
const HISTORY_EXCHANGES: i64 = 200;

/// The session's recent exchanges, oldest first.
pub async fn recent(pool: &PgPool, session_id: &str) -> Result<Vec<(String, String)>, sqlx::Error> {
    let rows = sqlx::query(include_str!("../../sql/turn/recent_history.sql"))
        .bind(session_id)
        .bind(HISTORY_EXCHANGES)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("user_text")?, r.try_get("reply_text")?)))
        .collect()
}

/// Re-reads the most recent exchanges that fit `budget` tokens in total (base included).
pub fn rebuild(
    engine: &Engine,
    session: &mut KvSession,
    history: &[(String, String)],
    budget: u32,
) -> Result<(), EngineError> {
    let mut picked = Vec::new();
    let mut total = session.len();
    for (u, a) in history.iter().rev() {
        let t = engine.block(&engine.frame.exchange, &[u, a]);
        if total + t.len() as u32 > budget {
            break;
        }
        total += t.len() as u32;
        picked.push(t);
    }
    for t in picked.iter().rev() {
        session.append(t, Some(SegKind::Turn))?;
    }
    Ok(())
}
