//! `/v1/chat/completions`: enqueue through the same SQL path as any backend, wait for the
//! fenced completion, and answer in OpenAI's shape; with `"stream": true` the reply is
//! relayed as it is generated ([`super::sse`]).

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio::sync::broadcast;

use crate::config::SystemMessage;
use crate::queue::{self, Conversation, NewTurn, Repeat, TurnId};

use super::answer::{delivered, erased, fingerprint, OwnedTurnRow};
use super::conversation::{self as conv, Dialogue};
use super::error::ApiError;
use super::identity::Caller;
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

/// What a chat request asks for, read from its body and headers.
struct Asked {
    /// The session the request names (`session_id`, `X-Session-Id`), if any.
    session: Option<String>,
    /// The conversation a header names (`http.conversation_header`), if any.
    conversation: Option<String>,
    user: String,
    character: i64,
    dialogue: Dialogue,
    model: Option<String>,
    timeout: Duration,
    key: Option<String>,
    stream: bool,
    include_usage: bool,
    /// The turn's sampling options and the system message ([`super::fields`]).
    fields: super::fields::Fields,
}

/// `POST /v1/chat/completions`. kvmem keeps the dialogue itself: a request that names its
/// session sends its last user message, and earlier messages are ignored; one that does not
/// is queued in the session its history matches ([`conv`]). A retry of a request is the
/// turn its first attempt queued ([`enqueue`]). The session is named in `x-kvmem-session`.
pub(super) async fn chat(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let asked = read(&state, &caller, &headers, &body).await?;
    if let Some(system) = asked.fields.system.as_deref() {
        if state.settings.http.system_message == SystemMessage::Persona {
            super::models::set_persona(&state.pool, asked.character, &asked.user, system).await?;
        }
    }
    // Subscribe before enqueueing, so a fast completion cannot slip past us.
    let mut done = state.done.subscribe();
    let (id, session, how) = enqueue(&state, &asked, &headers, &body).await?;
    state.fault("queued")?;
    let mut response = if asked.stream {
        let reply = super::sse::Reply {
            id,
            user: asked.user,
            model: asked.model,
            include_usage: asked.include_usage,
        };
        super::sse::stream(state, reply, asked.timeout).await?
    } else {
        wait_done(&state.pool, &mut done, id, asked.timeout).await?;
        state.fault("done")?;
        respond(&state, id, &asked.user, asked.model).await?
    };
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&session) {
        h.insert(HeaderName::from_static("x-kvmem-session"), v);
    }
    h.insert(
        HeaderName::from_static("x-kvmem-conversation"),
        HeaderValue::from_static(how),
    );
    Ok(response)
}

async fn read(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Asked, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("request body is not valid UTF-8"))?;
    let req: ChatRequest = serde_json::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("invalid request JSON: {e}")))?;
    let fields = super::fields::read(&serde_json::from_str(text).unwrap_or_default())?;
    let session = req.session_id.or_else(|| header(headers, "x-session-id"));
    let key = header(headers, "idempotency-key");
    bounded_id("session_id", session.as_deref())?;
    bounded_id("Idempotency-Key", key.as_deref())?;
    let user = caller.user(req.user.as_deref())?;
    // `character_id` (or its header) wins; else `model` names one of the user's characters.
    let character =
        match (req.character_id, header(headers, "x-character-id")) {
            (Some(c), _) => c,
            (None, Some(h)) => h
                .parse()
                .map_err(|_| ApiError::bad_request("X-Character-Id must be an integer"))?,
            (None, None) => match req.model.as_deref() {
                Some(model) => super::models::select(&state.pool, &user, model).await?,
                None => return Err(ApiError::bad_request(
                    "missing character (body `model` or `character_id`, or header X-Character-Id)",
                )),
            },
        };
    let dialogue = conv::read(
        req.messages.iter().map(|m| (m.role.as_str(), &m.content)),
        state.settings.http.max_message_chars,
    )?;
    background_task(&state.settings.http.task_marker, &dialogue.last)?;
    Ok(Asked {
        session,
        conversation: conv::conversation_name(state, headers),
        user,
        character,
        dialogue,
        model: req.model,
        timeout: timeout(state, headers)?,
        key,
        stream: req.stream,
        include_usage: req.stream_options.is_some_and(|o| o.include_usage),
        fields,
    })
}

/// A front-end's background task (a title, tags, follow-ups for a chat) is not a line of
/// the chat: answering it in character would add a session and a memory per chat. It is
/// refused, finally, before the character is even looked up.
fn background_task(marker: &str, last: &str) -> Result<(), ApiError> {
    if marker.is_empty() || !last.trim_start().starts_with(marker) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        "background_task",
        format!(
            "a front-end's background task (its message starts with {marker:?}) is not a chat \
             turn; kvmem refuses it so it adds no session or memory. Point the front-end's \
             task model elsewhere or turn the task off (docs/http-api.md#front-ends)"
        ),
    )
    .final_answer())
}

/// The longest id a request may give (a session, a key, a conversation): the queue's
/// B-tree indexes hold far longer, so a longer one is a client's bug, answered 400.
pub(super) const MAX_ID_BYTES: usize = crate::keys::MAX_USER_BYTES;

pub(super) fn bounded_id(what: &str, id: Option<&str>) -> Result<(), ApiError> {
    match id {
        Some(id) if id.len() > MAX_ID_BYTES => Err(ApiError::bad_request(format!(
            "{what} is {} bytes; the limit is {MAX_ID_BYTES}",
            id.len()
        ))),
        Some(id) if id.chars().any(char::is_control) => Err(ApiError::bad_request(format!(
            "{what} holds a control character"
        ))),
        _ => Ok(()),
    }
}

fn history_limits(state: &AppState) -> queue::HistoryLimits {
    queue::HistoryLimits {
        messages: state.settings.http.max_history_messages,
        chars: state.settings.http.max_history_chars,
    }
}

fn timeout(state: &AppState, headers: &HeaderMap) -> Result<Duration, ApiError> {
    let ms = match header(headers, "x-timeout-ms") {
        None => state.settings.http.timeout_ms,
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| {
                ApiError::bad_request("X-Timeout-Ms must be a whole number of milliseconds")
            })?
            .min(state.settings.http.max_timeout_ms),
    };
    Ok(Duration::from_millis(ms))
}

/// Queues the request's turn, or finds the one it repeats; returns it with its session and
/// how the session was found (`x-kvmem-conversation`). A request that names no session goes
/// to the one a conversation header names, or else to the one its history matches
/// ([`conv`]). With an `Idempotency-Key` the key decides, as in `kvmem_enqueue_turn`.
/// Without one, the OpenAI SDKs' retries (408, 409, 429 and 5xx, twice by default) would
/// each queue the message again: a request with the same user, session, character and body
/// as the one that queued the session's latest turn is that turn while it is queued or
/// running, and for `http.retry_window_ms` after it ended when the client says it retries
/// (`x-stainless-retry-count` above 0) or the turn's answer was never delivered.
async fn enqueue(
    state: &AppState,
    asked: &Asked,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(TurnId, String, &'static str), ApiError> {
    let (retry, window_ms) = (is_retry(headers), state.settings.http.retry_window_ms);
    let (session, how) = match (&asked.session, &asked.conversation) {
        (Some(s), _) => (s.clone(), "session"),
        (None, Some(name)) => (
            conv::named_session(&asked.user, asked.character, name),
            "named",
        ),
        (None, None) => {
            // Not bound to a session: a repeat is found among the user's turns by its body.
            let hash = request_hash(asked, "", body);
            let repeat = Repeat {
                hash: &hash,
                retry,
                window_ms,
            };
            let c = Conversation {
                user_id: &asked.user,
                character_id: asked.character,
                message: &asked.dialogue.message,
                history: &asked.dialogue.history,
                idempotency_key: asked.key.as_deref(),
                options: asked.fields.options.as_ref(),
                limits: history_limits(state),
            };
            let placed = conv::enqueue_matched(state, &c, repeat).await?;
            return Ok((placed.turn, placed.session_id, conv::how(&placed.found)));
        }
    };
    let named = asked.session.is_none();
    let turn = NewTurn {
        session_id: &session,
        user_id: &asked.user,
        character_id: asked.character,
        message: if named {
            &asked.dialogue.message
        } else {
            &asked.dialogue.last
        },
        idempotency_key: asked.key.as_deref(),
        options: asked.fields.options.as_ref(),
    };
    if asked.key.is_some() && !named {
        return Ok((
            queue::enqueue_on(&state.pool, &turn, "live").await?,
            session,
            how,
        ));
    }
    let hash = request_hash(asked, &session, body);
    let repeat = Repeat {
        hash: &hash,
        retry,
        window_ms,
    };
    let (id, again) = if named {
        let limits = history_limits(state);
        queue::enqueue_named(&state.pool, &turn, &asked.dialogue.history, limits, repeat).await?
    } else {
        queue::enqueue_repeatable(&state.pool, &turn, repeat).await?
    };
    if again {
        tracing::info!(
            turn_id = id.0,
            retry,
            "a repeated chat request joins its turn"
        );
    }
    Ok((id, session, how))
}

/// The request's identity: who asks, where (empty when it names no session), and the exact
/// body. Each part is length-prefixed, so no two different requests hash alike by shifting
/// text between parts.
fn request_hash(asked: &Asked, session: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    let character = asked.character.to_string();
    for part in [
        asked.user.as_bytes(),
        session.as_bytes(),
        character.as_bytes(),
        body,
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    hex::encode(h.finalize())
}

/// The OpenAI SDKs count their attempts in `x-stainless-retry-count` (0 on the first).
fn is_retry(headers: &HeaderMap) -> bool {
    header(headers, "x-stainless-retry-count")
        .and_then(|v| v.trim().parse::<u32>().ok())
        .is_some_and(|n| n > 0)
}

async fn turn_state(pool: &PgPool, id: TurnId) -> Result<String, ApiError> {
    sqlx::query_scalar(include_str!("../../sql/http/turn_state.sql"))
        .bind(id.0)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| erased(id))
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
        .ok_or_else(|| erased(id))?;
    delivered(&state.pool, id).await?;
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
            "finish_reason": row.finish_reason(),
        }],
        "usage": row.usage(),
        "kvmem": row.kvmem(id),
    });
    Ok(Json(body).into_response())
}
