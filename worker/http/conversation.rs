//! The conversation a chat request carries, for a front-end that sends the whole history on
//! every request and no id of kvmem's: the session a conversation header names, and the
//! queueing of a request that names no session by what its history matches
//! ([`crate::queue::enqueue_matched`]). Its messages are read as exchanges by the request
//! reader ([`super::request::dialogue`]).

use axum::http::StatusCode;
use sha2::{Digest, Sha256};

use super::characters::lookup_error;
use super::error::ApiError;
use super::state::AppState;
use crate::characters;
use crate::queue::{self, Conversation, Found, Placed, Repeat};

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
    let owned = characters::may_talk(&state.pool, c.character_id, c.user_id)
        .await
        .map_err(lookup_error)?;
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

    #[test]
    fn named_sessions_are_per_user_and_character() {
        let a = named_session("u1", 1, "chat-9");
        assert_eq!(a, named_session("u1", 1, "chat-9"));
        assert_ne!(a, named_session("u2", 1, "chat-9"));
        assert_ne!(a, named_session("u1", 2, "chat-9"));
    }
}
