//! `/v1/chat/completions`: enqueue through the same SQL path as any backend, wait for the
//! fenced completion, and answer in OpenAI's shape; with `"stream": true` the reply is
//! relayed as it is generated ([`super::sse`]).

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio::sync::broadcast;

use crate::config::SystemMessage;
use crate::queue::{self, Conversation, NewTurn, Repeat, TurnId};

use super::answer::{delivered, erased, fingerprint};
use super::conversation as conv;
use super::error::ApiError;
use super::identity::Caller;
use super::request::{self, Character, Dialogue, Fields, RequestError};
use super::state::{header, AppState};

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
    /// The turn's sampling options and the system message.
    fields: Fields,
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
    if state.settings.http.system_message == SystemMessage::Persona {
        if let Some(persona) = asked.fields.persona()? {
            super::models::set_persona(&state.pool, asked.character, &asked.user, persona).await?;
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
    let http = &state.settings.http;
    let session = header(headers, "x-session-id");
    let req = request::read(body, session, header(headers, "idempotency-key"))?;
    let user = caller.user(req.user.as_deref())?;
    let character = match req.character(header(headers, "x-character-id").as_deref())? {
        Character::Id(c) => c,
        Character::Model(model) => super::models::select(&state.pool, &user, model).await?,
    };
    let dialogue = req.dialogue(http.max_message_chars, &http.task_marker)?;
    let timeout_ms = request::timeout_ms(
        header(headers, "x-timeout-ms").as_deref(),
        http.timeout_ms,
        http.max_timeout_ms,
    )?;
    Ok(Asked {
        session: req.session,
        conversation: conv::conversation_name(state, headers),
        user,
        character,
        dialogue,
        model: req.model,
        timeout: Duration::from_millis(timeout_ms),
        key: req.key,
        stream: req.stream,
        include_usage: req.include_usage,
        fields: req.fields,
    })
}

/// The reader's refusals, answered as they were when it lived here: a 400 of OpenAI's
/// `invalid_request_error` (with `param` for a field), and a front-end's background task
/// as its own error type, which a retry would only repeat.
impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> ApiError {
        if let RequestError::BackgroundTask { .. } = e {
            return ApiError::new(StatusCode::BAD_REQUEST, "background_task", e.to_string())
                .final_answer();
        }
        let mut error = ApiError::bad_request(e.to_string());
        if let Some(param) = e.param() {
            error.extra = json!({ "param": param });
        }
        error
    }
}

// The reader cannot see `keys` or `characters` (it builds without the crate); its bounds
// must stay theirs: the same indexes hold the ids, and a persona is a persona.
const _: () = assert!(request::MAX_ID_BYTES == crate::keys::MAX_USER_BYTES);
const _: () = assert!(request::MAX_PERSONA_CHARS == crate::characters::MAX_PERSONA_CHARS);

fn history_limits(state: &AppState) -> queue::HistoryLimits {
    queue::HistoryLimits {
        messages: state.settings.http.max_history_messages,
        chars: state.settings.http.max_history_chars,
    }
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
    queue::turn_state(pool, id).await?.ok_or_else(|| erased(id))
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
    let row = queue::owned_turn(&state.pool, id, user)
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
