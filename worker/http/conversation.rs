//! The conversation a chat request carries, for a front-end that sends the whole history on
//! every request and no id of kvmem's: its messages read as exchanges, the session a
//! conversation header names, and the queueing of a request that names no session by what
//! its history matches ([`crate::queue::enqueue_matched`]).

use axum::http::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::state::AppState;
use crate::queue::{self, Conversation, Found, Placed, Repeat};

/// A request's `messages` read as a dialogue: the exchanges before its message, and the
/// message. System and developer messages are set aside (they are not dialogue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Dialogue {
    /// (message, reply) per exchange, oldest first. A run of user messages is one message
    /// and a run of assistant messages one reply, joined by a blank line; a reply before any
    /// user message (a character's greeting) answers an empty message.
    pub(super) history: Vec<(String, String)>,
    /// The run of user messages that ends the dialogue, joined as in `history`.
    pub(super) message: String,
    /// The last user message alone: what a request naming its session sends.
    pub(super) last: String,
}

/// Reads `(role, content)` pairs. Messages after the last user message are not read: kvmem
/// does not continue a reply the client began.
pub(super) fn read<'a>(
    messages: impl Iterator<Item = (&'a str, &'a Value)>,
    max_chars: usize,
) -> Result<Dialogue, ApiError> {
    let mut turns: Vec<(bool, String)> = Vec::new();
    for (i, (role, content)) in messages.enumerate() {
        let is_user = match role {
            "user" => true,
            "assistant" => false,
            "system" | "developer" => continue,
            other => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}]: role `{other}` is not supported (user, assistant, system)"
                )))
            }
        };
        let text = text(i, content, is_user)?;
        let chars = text.chars().count();
        if chars > max_chars {
            return Err(ApiError::bad_request(format!(
                "messages[{i}] has {chars} characters; the limit is {max_chars} \
                 (http.max_message_chars)"
            )));
        }
        if text.contains('\0') {
            return Err(ApiError::bad_request(format!(
                "messages[{i}] contains a NUL byte (0x00), which text cannot hold"
            )));
        }
        if text
            .chars()
            .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
        {
            return Err(ApiError::bad_request(format!(
                "messages[{i}] contains control characters (only tab, CR and LF are allowed)"
            )));
        }
        turns.push((is_user, text));
    }
    let end = turns
        .iter()
        .rposition(|(is_user, _)| *is_user)
        .ok_or_else(|| ApiError::bad_request("no user message in `messages`"))?;
    let start = turns[..end]
        .iter()
        .rposition(|(is_user, _)| !*is_user)
        .map_or(0, |i| i + 1);
    let message = turns[start..=end]
        .iter()
        .map(|(_, t)| t.as_str())
        .collect::<Vec<_>>()
        .join("\n\n");
    Ok(Dialogue {
        history: exchanges(&turns[..start]),
        message,
        last: turns[end].1.clone(),
    })
}

/// Groups alternating runs into (message, reply) exchanges.
fn exchanges(turns: &[(bool, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(Vec<&str>, Vec<&str>)> = Vec::new();
    for (is_user, text) in turns {
        match out.last_mut() {
            Some((_, reply)) if *is_user && reply.is_empty() => {}
            Some((_, reply)) if !*is_user => {
                reply.push(text);
                continue;
            }
            _ => out.push((Vec::new(), Vec::new())),
        }
        let (message, reply) = out.last_mut().expect("pushed above");
        if *is_user {
            message.push(text);
        } else {
            reply.push(text);
        }
    }
    out.into_iter()
        .map(|(m, r)| (m.join("\n\n"), r.join("\n\n")))
        .collect()
}

/// A message's text: a string, or OpenAI's content parts when all are text (joined). An
/// assistant message may have no content (it called a tool): it reads as empty.
fn text(i: usize, content: &Value, is_user: bool) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Null if !is_user => Ok(String::new()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
                (Some("text"), Some(t)) => Ok(t),
                _ => Err(ApiError::bad_request(format!(
                    "messages[{i}]: only text content is supported"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|t| t.concat()),
        _ => Err(ApiError::bad_request("message content must be a string")),
    }
}

/// The session a conversation header names for this user and character. A hash of the
/// three, so one front-end's chat id never reaches another user's or character's session.
pub(super) fn named_session(user: &str, character: i64, name: &str) -> String {
    let mut h = Sha256::new();
    let character = character.to_string();
    for part in [user.as_bytes(), character.as_bytes(), name.as_bytes()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    format!("conv-{}", &hex::encode(h.finalize())[..32])
}

/// The value of the configured conversation header, if the request has one.
pub(super) fn conversation_name(
    state: &AppState,
    headers: &axum::http::HeaderMap,
) -> Option<String> {
    let name = state.settings.http.conversation_header.trim();
    if name.is_empty() {
        return None;
    }
    super::state::header(headers, name).filter(|v| !v.trim().is_empty())
}

/// What `x-kvmem-conversation` says of how the request found its session.
pub(super) fn how(found: &Found) -> &'static str {
    match found {
        Found::Repeat => "repeat",
        Found::Continued => "continued",
        Found::Branched { .. } => "branched",
        Found::Started => "started",
    }
}

/// Queues a request that names no session in the session its history matches (see
/// [`queue::enqueue_matched`]). The character is checked first, as `kvmem_enqueue_turn`
/// checks it, so a foreign one is reported as missing before anything is copied.
pub(super) async fn enqueue_matched(
    state: &AppState,
    c: &Conversation<'_>,
    repeat: Repeat<'_>,
) -> Result<Placed, ApiError> {
    let owned: bool = sqlx::query_scalar(include_str!("../../sql/http/character_owned.sql"))
        .bind(c.character_id)
        .bind(c.user_id)
        .fetch_one(&state.pool)
        .await?;
    if !owned {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!(
                "kvmem: unknown character {} for user {}",
                c.character_id, c.user_id
            ),
        ));
    }
    let placed = queue::enqueue_matched(&state.pool, c, repeat).await?;
    match &placed.found {
        Found::Branched { from, at_turn } => tracing::info!(
            turn_id = placed.turn.0,
            session = %placed.session_id,
            from = %from,
            at_turn,
            "a chat request branches its session"
        ),
        found => tracing::debug!(
            turn_id = placed.turn.0,
            how = how(found),
            "chat request matched"
        ),
    }
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dialogue(messages: Value) -> Result<Dialogue, ApiError> {
        let list = messages.as_array().unwrap().clone();
        let pairs: Vec<(String, Value)> = list
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_string(),
                    m["content"].clone(),
                )
            })
            .collect();
        read(pairs.iter().map(|(r, c)| (r.as_str(), c)), 32_000)
    }

    fn pair(m: &str, r: &str) -> (String, String) {
        (m.to_string(), r.to_string())
    }

    #[test]
    fn a_front_ends_history_reads_as_exchanges() {
        let d = dialogue(json!([
            {"role": "system", "content": "Be brief."},
            {"role": "assistant", "content": "Welcome aboard."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "user", "content": "One"},
            {"role": "user", "content": "Two"},
            {"role": "assistant", "content": "A"},
            {"role": "assistant", "content": "B"},
            {"role": "user", "content": "Three"},
            {"role": "user", "content": "Four"},
        ]))
        .unwrap_or_else(|e| panic!("{}", e.body()));
        assert_eq!(
            d.history,
            vec![
                pair("", "Welcome aboard."),
                pair("Hi", "Hello"),
                pair("One\n\nTwo", "A\n\nB")
            ]
        );
        assert_eq!(d.message, "Three\n\nFour");
        assert_eq!(d.last, "Four");
    }

    #[test]
    fn a_request_without_a_user_message_or_with_a_tool_message_is_refused() {
        assert!(dialogue(json!([{"role": "assistant", "content": "x"}])).is_err());
        let tool = json!([{"role": "tool", "content": "x"}, {"role": "user", "content": "y"}]);
        let e = dialogue(tool).unwrap_err().body().to_string();
        assert!(e.contains("messages[0]"), "{e}");
    }

    #[test]
    fn named_sessions_are_per_user_and_character() {
        let a = named_session("u1", 1, "chat-9");
        assert_eq!(a, named_session("u1", 1, "chat-9"));
        assert_ne!(a, named_session("u2", 1, "chat-9"));
        assert_ne!(a, named_session("u1", 2, "chat-9"));
    }
}
