//! The cold path's dialogue: what a turn reads back when no snapshot can be trusted (the
//! recorded KV dialogue of the last committed turn, or else the text of `messages`), and
//! how it is laid back into an empty KV.

use llama_cpp_2::token::LlamaToken;
use sqlx::PgPool;

use crate::engine::{Engine, EngineError, KvSession};
use crate::snapshot::{parse_segments, SegKind};
use crate::turn::KvRecord;

/// A session's `session_kv` row: the KV's dialogue after a committed turn, and for whom.
pub struct Recorded {
    pub user_id: String,
    pub character_id: i64,
    pub turn_id: i64,
    pub record: KvRecord,
}

/// A `session_kv` row as read, before its segment table is checked.
#[derive(sqlx::FromRow)]
struct KvRow {
    user_id: String,
    character_id: i64,
    turn_id: i64,
    model_sha: String,
    token_ids: Vec<i32>,
    segments: String,
    digest_version: String,
}

/// A recorded row whose segment table does not tile its tokens.
#[derive(Debug, thiserror::Error)]
#[error("recorded segments unreadable: {0}")]
pub struct Unreadable(String);

/// The session's recorded KV dialogue. A row whose segment table does not tile its tokens
/// is reported as [`Unreadable`]: the caller falls back to the text rebuild.
pub async fn recorded(
    pool: &PgPool,
    session_id: &str,
) -> Result<Option<Result<Recorded, Unreadable>>, sqlx::Error> {
    let Some(row) = sqlx::query_as::<_, KvRow>(include_str!("../../sql/turn/session_kv.sql"))
        .bind(session_id)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let segments = match parse_segments(&row.segments, row.token_ids.len() as u32) {
        Ok(segments) => segments,
        Err(e) => return Ok(Some(Err(Unreadable(e.to_string())))),
    };
    Ok(Some(Ok(Recorded {
        user_id: row.user_id,
        character_id: row.character_id,
        turn_id: row.turn_id,
        record: KvRecord {
            model_sha: row.model_sha,
            token_ids: row.token_ids,
            segments,
            digest_version: row.digest_version,
        },
    })))
}

/// Decodes a recorded dialogue segment by segment, so the KV gets the same tokens at the
/// same positions with the same segment table as the warm KV it records.
pub fn decode_exact(session: &mut KvSession, record: &KvRecord) -> Result<(), EngineError> {
    let tokens: Vec<LlamaToken> = record.token_ids.iter().map(|&t| LlamaToken(t)).collect();
    let mut at = 0usize;
    for seg in &record.segments {
        let end = at + seg.len as usize;
        let span = tokens
            .get(at..end)
            .ok_or_else(|| EngineError::Context("recorded segments exceed the tokens".into()))?;
        session.append_segment(span, seg.kind, &seg.tag)?;
        at = end;
    }
    Ok(())
}

/// How many recent exchanges a cold start reads back (bounded again by the tail).
const HISTORY_EXCHANGES: i64 = 200;

/// One exchange of the dialogue text, and the turn it came from (0 for a compaction's recap).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Exchange {
    pub turn_id: i64,
    #[sqlx(rename = "user_text")]
    pub user: String,
    #[sqlx(rename = "reply_text")]
    pub reply: String,
}

/// The session's recent exchanges, oldest first.
pub async fn recent(pool: &PgPool, session_id: &str) -> Result<Vec<Exchange>, sqlx::Error> {
    sqlx::query_as(include_str!("../../sql/turn/recent_history.sql"))
        .bind(session_id)
        .bind(HISTORY_EXCHANGES)
        .fetch_all(pool)
        .await
}

/// Re-reads the most recent exchanges that fit `budget` tokens in total (base included),
/// each a segment tagged with its turn, as the warm KV tags them.
pub fn rebuild(
    engine: &Engine,
    session: &mut KvSession,
    history: &[Exchange],
    budget: u32,
) -> Result<(), EngineError> {
    let mut picked = Vec::new();
    let mut total = session.len();
    for x in history.iter().rev() {
        let t = engine.block(&engine.frame.exchange, &[&x.user, &x.reply]);
        if total + t.len() as u32 > budget {
            break;
        }
        total += t.len() as u32;
        picked.push((x.turn_id, t));
    }
    for (turn_id, t) in picked.iter().rev() {
        let tag = if *turn_id > 0 {
            turn_id.to_string()
        } else {
            String::new()
        };
        session.append_segment(t, SegKind::Turn, &tag)?;
    }
    Ok(())
}
