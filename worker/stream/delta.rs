//! A delta, as a notification's payload and the late readers' table carry it: its limits,
//! its notes, and the reads and trims of the table.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;

/// Most bytes of reply text in one delta. JSON writes at most six bytes for one byte of
/// text (a control character as `\u00XX`), so a payload stays under Postgres's 8,000-byte
/// NOTIFY limit with room for its other fields and the first delta's `meta`.
pub const MAX_DELTA_BYTES: usize = 1_000;

/// How long deltas are kept for late readers. A finished turn's reply is in `turns.reply`;
/// a running turn's newest delta is at most one token old.
pub const RETENTION_SECS: f64 = 600.0;

/// One delta, as its notification's payload carries it (and `kvmem_turn_stream` returns
/// it joined).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    pub turn_id: i64,
    /// The run's fencing token: every run of a turn has a larger one than the run before.
    pub attempt: i64,
    pub seq: i32,
    /// Seq 0 of an attempt: whatever an earlier attempt sent is void.
    pub reset: bool,
    pub text: String,
    /// This attempt's text is whole.
    pub done: bool,
    /// On seq 0: what the turn knew when it started generating (cold, digest_injected, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
}

/// What a turn's channel carries: deltas, then the message that ends the turn (the same
/// JSON as `kvmem_turn_done`'s).
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    Delta(Delta),
    /// The turn reached `done`, `failed` or `dead`.
    End {
        turn_id: i64,
        state: String,
    },
}

impl Note {
    /// Parses a payload of a turn's or session's channel; `None` for anything else.
    pub fn parse(payload: &str) -> Option<Note> {
        let v: Value = serde_json::from_str(payload).ok()?;
        if let Some(state) = v.get("state").and_then(Value::as_str) {
            return Some(Note::End {
                turn_id: v.get("turn_id")?.as_i64()?,
                state: state.to_string(),
            });
        }
        serde_json::from_value(v).ok().map(Note::Delta)
    }

    pub fn turn_id(&self) -> i64 {
        match self {
            Note::Delta(d) => d.turn_id,
            Note::End { turn_id, .. } => *turn_id,
        }
    }
}

/// What `kvmem_turn_stream` returns for a turn: its state and the newest attempt's text so far.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SoFar {
    pub state: String,
    pub attempt: Option<i64>,
    pub seq: Option<i32>,
    pub text: String,
    pub done: bool,
    pub meta: Option<Value>,
}

/// `kvmem_turn_stream(turn_id)`: `None` for an unknown turn.
pub async fn so_far(pool: &PgPool, turn_id: i64) -> Result<Option<SoFar>, sqlx::Error> {
    sqlx::query_as(include_str!("../../sql/stream/so_far.sql"))
        .bind(turn_id)
        .fetch_optional(pool)
        .await
}

/// The turn's channel name, from the SQL function that defines it.
pub async fn turn_channel(pool: &PgPool, turn_id: i64) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(include_str!("../../sql/stream/turn_channel.sql"))
        .bind(turn_id)
        .fetch_one(pool)
        .await
}

/// Deletes deltas past [`RETENTION_SECS`], a bounded batch per call (the reaper's tick).
pub async fn trim(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(include_str!("../../sql/stream/trim.sql"))
        .bind(RETENTION_SECS)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// Splits `text` into pieces of at most `max` bytes, on character boundaries (a piece is
/// longer only when one character is: never, for `max` >= 4).
pub fn pieces(text: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > max {
        let mut cut = max;
        while cut > 0 && !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut == 0 {
            cut = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    if !rest.is_empty() || out.is_empty() {
        out.push(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cut_on_character_boundaries() {
        assert_eq!(pieces("", 4), vec![""]);
        assert_eq!(pieces("abcdef", 4), vec!["abcd", "ef"]);
        // "é" is two bytes: a cut at byte 3 would split the second one.
        assert_eq!(pieces("aéé", 4), vec!["aé", "é"]);
        let long = "日本語".repeat(500);
        let parts = pieces(&long, MAX_DELTA_BYTES);
        assert!(parts.iter().all(|p| p.len() <= MAX_DELTA_BYTES));
        assert_eq!(parts.concat(), long);
    }

    #[test]
    fn the_largest_delta_fits_a_notification() {
        // Every byte a control character: the worst case for JSON's escaping.
        let text = "\u{1}".repeat(MAX_DELTA_BYTES);
        let delta = Delta {
            turn_id: i64::MAX,
            attempt: i64::MAX,
            seq: i32::MAX,
            reset: true,
            text,
            done: true,
            meta: Some(serde_json::json!({
                "cold": true, "digest_injected": true, "digest_version": "f".repeat(64),
                "prompt_tokens": u32::MAX, "cached_tokens": u32::MAX,
            })),
        };
        let payload = serde_json::to_string(&delta).unwrap();
        assert!(payload.len() < 8_000, "{} bytes", payload.len());
        assert_eq!(Note::parse(&payload), Some(Note::Delta(delta)));
    }

    #[test]
    fn end_messages_parse_apart_from_deltas() {
        let end = r#"{"turn_id": 7, "session_id": "s", "state": "done"}"#;
        assert_eq!(
            Note::parse(end),
            Some(Note::End {
                turn_id: 7,
                state: "done".into()
            })
        );
        assert_eq!(Note::parse("not json"), None);
    }
}
