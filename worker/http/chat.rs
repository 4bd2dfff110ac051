//! `/v1/chat/completions`: enqueue through the same SQL path as any backend, wait for the
//! fenced completion, and answer in OpenAI's shape; with `"stream": true` the reply is
//! relayed as it is generated ([`super::sse`]).

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

use super::answer::{fingerprint, OwnedTurnRow};
use super::error::ApiError;
use super::state::{header, AppState};

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
    /// Server-sent `chat.completion.chunk` events instead of one `chat.completion`.
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct StreamOptions {
    /// A last chunk with `usage` (and `"usage": null` on every other chunk).
    #[serde(default)]
    include_usage: bool,
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
        None => state.settings.http.timeout_ms,
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| {
                ApiError::bad_request("X-Timeout-Ms must be a whole number of milliseconds")
            })?
            .min(state.settings.http.max_timeout_ms),
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
    let timeout = Duration::from_millis(timeout);
    if req.stream {
        let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
        let reply = super::sse::Reply {
            id,
            user,
            model: req.model,
            include_usage,
        };
        return super::sse::stream(state, reply, timeout).await;
    }
    wait_done(&state.pool, &mut done, id, timeout).await?;
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

async fn respond(
    state: &AppState,
    id: TurnId,
    user: &str,
    model: Option<String>,
) -> Result<Response, ApiError> {
    let row = OwnedTurnRow::fetch(&state.pool, id, user)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    if let Some(e) = row.error(id) {
        return Err(e);
    }
    let body = json!({
        "id": format!("chatcmpl-{}", id.0),
        "object": "chat.completion",
        "created": row.created,
        "model": model.unwrap_or_else(|| "kvmem".into()),
        "system_fingerprint": fingerprint(state),
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": row.reply.clone().unwrap_or_default() },
            "finish_reason": "stop",
        }],
        "usage": row.usage(),
        "kvmem": row.kvmem(id),
    });
    Ok(Json(body).into_response())
}
