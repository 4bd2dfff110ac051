//! `/v1/rotate-hint`: how full a session's context is, from its last log row and snapshot.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::{queue, snapshot};

use super::error::ApiError;
use super::identity::Caller;
use super::state::AppState;

#[derive(Deserialize)]
pub(super) struct HintQuery {
    sid: Option<String>,
}

/// `GET /v1/rotate-hint?sid=…` as the caller ([`super::identity`]): how full the caller's session's KV
/// is and whether the next turn prunes. Another user's session is answered exactly like a
/// session that does not exist.
pub(super) async fn rotate_hint(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<HintQuery>,
) -> Result<Response, ApiError> {
    let sid = q
        .sid
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("missing query parameter sid"))?;
    let user = caller.user(None)?;
    let owner = queue::session_owner(&state.pool, &sid).await?;
    let character = match owner {
        Some((owner, character)) if owner == user => character,
        _ => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found_error",
                format!("unknown session {sid} for user {user}"),
            ))
        }
    };
    let s = &state.settings;
    let header = snapshot_header(&state, &snapshot::scope_key(&user, character, &sid)).await?;
    let tokens = header.as_ref().map_or(0, |h| h.tokens);
    let last_user = queue::last_user_tokens(&state.pool, &sid).await?;
    // A next turn adds its user message and reply; the HUD is removed again.
    let next_turn = last_user.unwrap_or(32).max(0) as u32 + s.turn.reply_max_tokens;
    let digest = crate::context::digest::last_change(&state.pool, &sid).await?;
    let last_injected = queue::last_digest_injected(&state.pool, &sid).await?;
    Ok(Json(json!({
        "sid": sid,
        "snapshot": header.is_some(),
        "tokens_in_kv": tokens,
        "kv_tail_tokens": s.turn.kv_tail_tokens,
        "next_turn_tokens_estimate": next_turn,
        "will_prune": header.is_some() && tokens + next_turn > s.turn.kv_tail_tokens,
        "digest_version": digest.as_ref().map(|d| d.0.clone()),
        "kv_digest_version": header.as_ref().map(|h| h.digest_version.clone()),
        "digest_changed_since_kv": match (&digest, &header) {
            (Some(d), Some(h)) => d.0 != h.digest_version,
            _ => true,
        },
        "digest_last_injected_at": last_injected,
    }))
    .into_response())
}

/// The scope's snapshot header from the server's own store, so that with an object store
/// the bucket answers.
async fn snapshot_header(
    state: &AppState,
    scope: &str,
) -> Result<Option<snapshot::Header>, ApiError> {
    let store = &state.snapshots;
    store.header(scope).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("the snapshot store did not answer: {e}"),
        )
    })
}
