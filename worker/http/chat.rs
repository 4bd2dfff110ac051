//! `/v1/chat/completions`: enqueue through the same SQL path as any backend, wait for the
//! fenced completion, and answer in OpenAI's shape.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::sync::broadcast;

use crate::queue::{self, TurnId};

use super::{header, ApiError, AppState};

#[derive(Deserialize)]
struct ChatRequest {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<ChatMessage>,
    /// OpenAI's end-user field: kvmem's user id.
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    character_id: Option<i64>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Value,
}

/// `POST /v1/chat/completions`. kvmem keeps the dialogue itself, so only the last user
/// message is taken; earlier messages in the request are ignored.
pub(super) async fn chat(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request("request body is not valid UTF-8"))?;
    let req: ChatRequest = serde_json::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("invalid request JSON: {e}")))?;
    let session = req
        .session_id
        .or_else(|| header(&headers, "x-session-id"))
        .ok_or_else(|| {
            ApiError::bad_request("missing session id (body `session_id` or header X-Session-Id)")
        })?;
    let user = req
        .user
        .or_else(|| header(&headers, "x-user-id"))
        .ok_or_else(|| {
            ApiError::bad_request("missing user id (body `user` or header X-User-Id)")
        })?;
    let character = match req.character_id {
        Some(c) => c,
        None => header(&headers, "x-character-id")
            .ok_or_else(|| {
                ApiError::bad_request(
                    "missing character id (body `character_id` or header X-Character-Id)",
                )
            })?
            .parse()
            .map_err(|_| ApiError::bad_request("X-Character-Id must be an integer"))?,
    };
    let last = req
        .messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .ok_or_else(|| ApiError::bad_request("no user message in `messages`"))?;
    let message = last
        .content
        .as_str()
        .ok_or_else(|| ApiError::bad_request("message content must be a string"))?;
    let timeout = match header(&headers, "x-timeout-ms") {
        None => state.settings.http_timeout_ms,
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| {
                ApiError::bad_request("X-Timeout-Ms must be a whole number of milliseconds")
            })?
            .min(state.settings.http_max_timeout_ms),
    };
    let key = header(&headers, "idempotency-key");

    // Subscribe before enqueueing, so a fast completion cannot slip past us.
    let mut done = state.done.subscribe();
    let id = queue::enqueue(
        &state.pool,
        &session,
        &user,
        character,
        message,
        key.as_deref(),
    )
    .await?;
    wait_done(&state.pool, &mut done, id, Duration::from_millis(timeout)).await?;
    respond(&state, id, &user, req.model).await
}

async fn turn_state(pool: &PgPool, id: TurnId) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(include_str!("../../sql/http/turn_state.sql"))
        .bind(id.0)
        .fetch_one(pool)
        .await
}

async fn wait_done(
    pool: &PgPool,
    done: &mut broadcast::Receiver<i64>,
    id: TurnId,
    timeout: Duration,
) -> Result<(), ApiError> {
    let deadline = Instant::now() + timeout;
    loop {
        let state = turn_state(pool, id).await?;
        if matches!(state.as_str(), "done" | "failed" | "dead") {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let mut e = ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "timeout",
                format!(
                    "turn {id} did not finish within {} ms; it stays queued",
                    timeout.as_millis()
                ),
            );
            e.extra = json!({ "turn_id": id.0, "state": state });
            return Err(e);
        }
        // The notification is the fast path; the row check on each wake-up is the truth.
        let nap = left.min(Duration::from_millis(500));
        let _ = tokio::time::timeout(nap, async {
            loop {
                match done.recv().await {
                    Ok(t) if t == id.0 => return,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => {
                        tokio::time::sleep(nap).await;
                        return;
                    }
                }
            }
        })
        .await;
    }
}

/// A turn with its latest log row, as `turn_owned.sql` returns it; the log columns are
/// null while the turn has no log row.
#[derive(Debug, sqlx::FromRow)]
struct OwnedTurnRow {
    session_id: String,
    state: String,
    reply: Option<String>,
    error: Option<String>,
    attempts: i32,
    created: i64,
    u_tokens: Option<i32>,
    r_tokens: Option<i32>,
    cold: Option<bool>,
    digest_injected: Option<bool>,
    tokens_in_kv: Option<i32>,
    digest_version: Option<String>,
}

async fn respond(
    state: &AppState,
    id: TurnId,
    user: &str,
    model: Option<String>,
) -> Result<Response, ApiError> {
    let row = sqlx::query_as::<_, OwnedTurnRow>(include_str!("../../sql/http/turn_owned.sql"))
        .bind(id.0)
        .bind(user)
        .fetch_one(&state.pool)
        .await?;
    let error = row.error;
    match row.state.as_str() {
        "failed" => {
            let mut e = ApiError::bad_request(error.unwrap_or_default());
            e.extra = json!({ "turn_id": id.0 });
            return Err(e);
        }
        "dead" => {
            let mut e = ApiError::new(
                StatusCode::BAD_GATEWAY,
                "server_error",
                format!(
                    "turn failed after {} attempts: {}",
                    row.attempts,
                    error.unwrap_or_default()
                ),
            );
            e.extra = json!({ "turn_id": id.0 });
            return Err(e);
        }
        _ => {}
    }
    let (u, r) = (row.u_tokens.unwrap_or(0), row.r_tokens.unwrap_or(0));
    let body = json!({
        "id": format!("chatcmpl-{}", id.0),
        "object": "chat.completion",
        "created": row.created,
        "model": model.unwrap_or_else(|| "kvmem".into()),
        "system_fingerprint": format!("kvmem-{}", &state.model_sha[..state.model_sha.len().min(12)]),
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": row.reply.unwrap_or_default() },
            "finish_reason": "stop",
        }],
        "usage": { "prompt_tokens": u, "completion_tokens": r, "total_tokens": u + r },
        "kvmem": {
            "turn_id": id.0,
            "session_id": row.session_id,
            "cold": row.cold,
            "digest_injected": row.digest_injected,
            "digest_version": row.digest_version,
            "tokens_in_kv": row.tokens_in_kv,
        },
    });
    Ok(Json(body).into_response())
}
