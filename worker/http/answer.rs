//! What the chat endpoint answers from, streamed or not: the caller's own turn with its
//! log row, and the parts of OpenAI's shape made from it (usage, the error of a turn that
//! ended without a reply, the `kvmem` block).

use axum::http::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;

use super::error::ApiError;
use super::state::AppState;
use crate::queue::{self, OwnedTurn, TurnId};

/// A turn that is no longer there: erased (its user, character or session) while the
/// request waited. Final: a retry would queue the request again, and with it bring back
/// the history the erase removed.
pub(super) fn erased(id: TurnId) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found_error",
        format!("turn {id} is gone: it was erased while this request waited"),
    )
    .final_answer()
}

// The parts of the answer made from the turn's row (`queue::owned_turn`) are made here,
// where the API's error and shape live; the row itself is the queue's.
impl OwnedTurn {
    /// The error a turn that ended without a reply answers with.
    pub(super) fn error(&self, id: TurnId) -> Option<ApiError> {
        let error = self.error.clone().unwrap_or_default();
        let mut e = match self.state.as_str() {
            "failed" => ApiError::bad_request(error),
            "dead" => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "server_error",
                format!("turn failed after {} attempts: {error}", self.attempts),
            )
            .final_answer(),
            _ => return None,
        };
        e.extra = json!({ "turn_id": id.0 });
        Some(e)
    }

    /// OpenAI's `finish_reason`: "length" when `REPLY_MAX_TOKENS` cut the reply off. Log rows
    /// written before the column existed read as "stop", which is all they could say.
    pub(super) fn finish_reason(&self) -> &str {
        self.finish_reason.as_deref().unwrap_or("stop")
    }

    /// OpenAI's usage: the prompt is everything the reply was conditioned on (the KV when
    /// generation started), of which `cached_tokens` came from the session's snapshot
    /// rather than being decoded this turn.
    pub(super) fn usage(&self) -> Value {
        let prompt = self.prompt_tokens.unwrap_or(0);
        let cached = (prompt - self.prefill_tokens.unwrap_or(0)).max(0);
        let completion = self.r_tokens.unwrap_or(0);
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": { "cached_tokens": cached },
        })
    }

    /// The `kvmem` block: what the turn did with the session's KV and digest.
    pub(super) fn kvmem(&self, id: TurnId) -> Value {
        json!({
            "turn_id": id.0,
            "session_id": self.session_id,
            "cold": self.cold,
            "digest_injected": self.digest_injected,
            "digest_version": self.digest_version,
            "tokens_in_kv": self.tokens_in_kv,
            "user_tokens": self.u_tokens,
        })
    }
}

/// Records that the turn's answer (its reply, or the error it ended with) is being handed
/// to a client: an identical request after this, without a retry header, is a new turn.
/// Called before the answer goes out, so that the client's next request finds it.
pub(super) async fn delivered(pool: &PgPool, id: TurnId) -> Result<(), queue::QueueError> {
    queue::mark_delivered(pool, id).await
}

/// `system_fingerprint`: the model file, as `/v1/info` names it.
pub(super) fn fingerprint(state: &AppState) -> String {
    format!(
        "kvmem-{}",
        &state.model_sha[..state.model_sha.len().min(12)]
    )
}
