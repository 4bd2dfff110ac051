//! Seed 000's kvserver interface over HTTP: an OpenAI-compatible chat endpoint that
//! enqueues through the same SQL path as any backend and waits for the fenced completion,
//! plus rotate-hint, info and Prometheus metrics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Row};
use subtle::ConstantTimeEq;
use tokio::sync::{broadcast, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::config::Settings;
use crate::queue::{self, QueueError, TurnId};
use crate::snapshot::{self, Limits};

/// What the server needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    /// SHA-256 of the configured model file ("" when no model is configured).
    pub model_sha: String,
    /// What `/metrics` renders: the process-wide registry unless set otherwise.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Long-term memory for `/v1/memory/*` (503 there without it).
    pub memory: Option<Arc<crate::memory::MemoryService>>,
    done: broadcast::Sender<i64>,
}

impl AppState {
    pub fn new(pool: PgPool, settings: Arc<Settings>, model_sha: String) -> AppState {
        let (done, _) = broadcast::channel(4096);
        AppState {
            pool,
            settings,
            model_sha,
            metrics: crate::metrics::global(),
            memory: None,
            done,
        }
    }

    /// Serves `/v1/memory/*` from this memory service.
    pub fn with_memory(mut self, memory: Arc<crate::memory::MemoryService>) -> AppState {
        self.memory = Some(memory);
        self
    }

    /// Renders `metrics` at `/metrics` (a worker's own registry, in tests).
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> AppState {
        self.metrics = metrics;
        self
    }
}

/// The routes, behind the bearer token (when configured), the in-flight limit and the
/// body size limit.
pub fn router(state: AppState) -> Router {
    let in_flight = Arc::new(Semaphore::new(state.settings.http_max_in_flight as usize));
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/rotate-hint", get(rotate_hint))
        .route("/v1/info", get(info))
        .route("/metrics", get(metrics))
        .route("/v1/memory/search", get(memory_search))
        .route("/v1/memory", get(memory_snapshot))
        .route("/v1/memory/refresh", post(memory_refresh))
        .layer(DefaultBodyLimit::max(state.settings.http_max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(middleware::from_fn_with_state(in_flight, limit_in_flight))
        .with_state(state)
}

/// Refuses at once beyond `http_max_in_flight` requests: a client retrying on 503 is
/// better served than one waiting in an unbounded queue of held connections.
async fn limit_in_flight(
    State(in_flight): State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Response {
    match in_flight.try_acquire() {
        Ok(_permit) => next.run(request).await,
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "too many requests in flight; retry shortly",
        )
        .into_response(),
    }
}

/// `Authorization: Bearer <KVMEM_HTTP_TOKEN>` on every route when a token is configured.
async fn authorize(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(token) = state.settings.http_token.as_deref() else {
        return next.run(request).await;
    };
    let given = header(request.headers(), "authorization");
    let given = given.as_deref().and_then(|v| v.strip_prefix("Bearer "));
    // Constant time, so the comparison does not reveal how much of a guess was right.
    let ok = given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes())));
    if ok {
        next.run(request).await
    } else {
        let mut response = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or wrong bearer token (Authorization: Bearer <KVMEM_HTTP_TOKEN>)",
        )
        .into_response();
        response.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer"),
        );
        response
    }
}

/// Why `kvmem serve` must not start on this address with these settings, if it must not:
/// beyond loopback, the API is only served behind a bearer token.
pub fn check_exposure(addr: &std::net::SocketAddr, settings: &Settings) -> Result<(), String> {
    let has_token = settings
        .http_token
        .as_deref()
        .is_some_and(|t| !t.trim().is_empty());
    if addr.ip().is_loopback() || has_token {
        Ok(())
    } else {
        Err(format!(
            "refusing to listen on {addr} without KVMEM_HTTP_TOKEN: beyond loopback the API needs a bearer token"
        ))
    }
}

/// Serves until `shutdown`, with the completion listener running beside it.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    tokio::spawn(listen_done(
        state.pool.clone(),
        state.done.clone(),
        shutdown.clone(),
    ));
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// Forwards `kvmem_turn_done` notifications to waiting requests.
async fn listen_done(pool: PgPool, done: broadcast::Sender<i64>, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        let result: Result<(), sqlx::Error> = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(queue::TURN_DONE_CHANNEL).await?;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    n = listener.recv() => {
                        let n = n?;
                        let id = serde_json::from_str::<Value>(n.payload())
                            .ok()
                            .and_then(|v| v["turn_id"].as_i64());
                        if let Some(id) = id {
                            let _ = done.send(id);
                        }
                    }
                }
            }
        }
        .await;
        if let Err(e) = result {
            // Waiters also poll their row, so nothing is lost while we reconnect.
            warn!(error = %e, "completion listener lost; reconnecting");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// An error response in OpenAI's shape.
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    extra: Value,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            extra: Value::Null,
        }
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = json!({ "message": self.message, "type": self.kind });
        if let Value::Object(extra) = self.extra {
            error.as_object_mut().expect("object").extend(extra);
        }
        (self.status, Json(json!({ "error": error }))).into_response()
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> ApiError {
        if let QueueError::Db(sqlx::Error::Database(d)) = &e {
            match d.code().as_deref() {
                Some("22023") | Some("22021") | Some("22P05") => {
                    return ApiError::bad_request(d.message())
                }
                Some("P0002") => {
                    return ApiError::new(StatusCode::NOT_FOUND, "not_found_error", d.message())
                }
                _ => {}
            }
        }
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        )
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        ApiError::from(QueueError::Db(e))
    }
}

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

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// `POST /v1/chat/completions`. kvmem keeps the dialogue itself, so only the last user
/// message is taken; earlier messages in the request are ignored.
async fn chat(
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
    sqlx::query_scalar("SELECT state::text FROM turns WHERE id = $1")
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
    let row = sqlx::query(
        "SELECT t.session_id, t.state::text AS state, t.reply, t.error, t.attempts,
                extract(epoch FROM t.created_at)::bigint AS created,
                l.u_tokens, l.r_tokens, l.cold, l.digest_injected, l.tokens_in_kv, l.digest_version
           FROM turns t
           LEFT JOIN LATERAL (SELECT * FROM turn_log WHERE turn_id = t.id ORDER BY id DESC LIMIT 1) l ON true
          WHERE t.id = $1 AND t.user_id = $2",
    )
    .bind(id.0)
    .bind(user)
    .fetch_one(&state.pool)
    .await?;
    let turn_state: String = row.try_get("state")?;
    let error: Option<String> = row.try_get("error")?;
    match turn_state.as_str() {
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
                    row.try_get::<i32, _>("attempts")?,
                    error.unwrap_or_default()
                ),
            );
            e.extra = json!({ "turn_id": id.0 });
            return Err(e);
        }
        _ => {}
    }
    let (u, r): (Option<i32>, Option<i32>) = (row.try_get("u_tokens")?, row.try_get("r_tokens")?);
    let (u, r) = (u.unwrap_or(0), r.unwrap_or(0));
    let body = json!({
        "id": format!("chatcmpl-{}", id.0),
        "object": "chat.completion",
        "created": row.try_get::<i64, _>("created")?,
        "model": model.unwrap_or_else(|| "kvmem".into()),
        "system_fingerprint": format!("kvmem-{}", &state.model_sha[..state.model_sha.len().min(12)]),
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": row.try_get::<Option<String>, _>("reply")?.unwrap_or_default() },
            "finish_reason": "stop",
        }],
        "usage": { "prompt_tokens": u, "completion_tokens": r, "total_tokens": u + r },
        "kvmem": {
            "turn_id": id.0,
            "session_id": row.try_get::<String, _>("session_id")?,
            "cold": row.try_get::<Option<bool>, _>("cold")?,
            "digest_injected": row.try_get::<Option<bool>, _>("digest_injected")?,
            "digest_version": row.try_get::<Option<String>, _>("digest_version")?,
            "tokens_in_kv": row.try_get::<Option<i32>, _>("tokens_in_kv")?,
        },
    });
    Ok(Json(body).into_response())
}

#[derive(Deserialize)]
struct HintQuery {
    sid: Option<String>,
    user: Option<String>,
}

/// `GET /v1/rotate-hint?sid=…&user=…` (or `X-User-Id`): how full the caller's session's KV
/// is and whether the next turn prunes. Another user's session is answered exactly like a
/// session that does not exist.
async fn rotate_hint(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HintQuery>,
) -> Result<Response, ApiError> {
    let sid = q
        .sid
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("missing query parameter sid"))?;
    let user = q
        .user
        .or_else(|| header(&headers, "x-user-id"))
        .filter(|u| !u.trim().is_empty())
        .ok_or_else(|| {
            ApiError::bad_request("missing user id (query parameter user or header X-User-Id)")
        })?;
    let owner: Option<(String, i64)> = sqlx::query_as(
        "SELECT user_id, character_id FROM turns WHERE session_id = $1 ORDER BY id DESC LIMIT 1",
    )
    .bind(&sid)
    .fetch_optional(&state.pool)
    .await?;
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
    let path = snapshot::SnapshotStore::new(&s.kv_dir, Limits::LOOSE)
        .path(&snapshot::scope_key(&user, character, &sid));
    let header = std::fs::read(&path).ok().and_then(|bytes| {
        snapshot::parse_header(&bytes, Limits::LOOSE)
            .ok()
            .map(|(h, _)| h)
    });
    let tokens = header.as_ref().map_or(0, |h| h.tokens);
    let last_user: Option<i32> = sqlx::query_scalar(
        "SELECT u_tokens FROM turn_log WHERE sid = $1 AND status = 'OK' ORDER BY id DESC LIMIT 1",
    )
    .bind(&sid)
    .fetch_optional(&state.pool)
    .await?;
    // A next turn adds its user message and reply; the HUD is removed again.
    let next_turn = last_user.unwrap_or(32).max(0) as u32 + s.reply_max_tokens;
    let digest: Option<(String, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT digest_version, updated_at FROM state_digest WHERE session_id = $1")
            .bind(&sid)
            .fetch_optional(&state.pool)
            .await?;
    let last_injected: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT max(finished_at) FROM turn_log WHERE sid = $1 AND digest_injected AND status = 'OK'",
    )
    .bind(&sid)
    .fetch_one(&state.pool)
    .await?;
    Ok(Json(json!({
        "sid": sid,
        "snapshot": header.is_some(),
        "tokens_in_kv": tokens,
        "kv_tail_tokens": s.kv_tail_tokens,
        "next_turn_tokens_estimate": next_turn,
        "will_prune": header.is_some() && tokens + next_turn > s.kv_tail_tokens,
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

/// `GET /v1/info`: the system fingerprint and effective configuration (no secrets).
async fn info(State(state): State<AppState>) -> Result<Response, ApiError> {
    let s = &state.settings;
    let bpt: Option<i32> =
        sqlx::query_scalar("SELECT bpt FROM turn_log WHERE bpt > 0 ORDER BY id DESC LIMIT 1")
            .fetch_optional(&state.pool)
            .await?;
    let mut config = serde_json::to_value(s.as_ref()).unwrap_or(Value::Null);
    if let Some(obj) = config.as_object_mut() {
        obj.remove("database_url");
    }
    Ok(Json(json!({
        "service": "kvmem",
        "version": env!("CARGO_PKG_VERSION"),
        "model_sha": state.model_sha,
        "model_path": s.model_path,
        "llama_build": crate::engine::LLAMA_BUILD,
        "snapshot_format": format!("{} v{}", snapshot::MAGIC, snapshot::FORMAT_VERSION),
        "kv_type_k": s.kv_type.as_str(),
        "kv_type_v": s.kv_type.as_str(),
        "bpt": bpt,
        "config": config,
    }))
    .into_response())
}

async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let text = state.metrics.render(&state.pool).await?;
    Ok((
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

impl From<crate::memory::http::HttpError> for ApiError {
    fn from(e: crate::memory::http::HttpError) -> ApiError {
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let kind = match e {
            crate::memory::http::HttpError::BadRequest(_) => "invalid_request_error",
            crate::memory::http::HttpError::NotFound(_) => "not_found_error",
            crate::memory::http::HttpError::Internal(_) => "server_error",
        };
        ApiError::new(status, kind, e.to_string())
    }
}

fn memory_service(state: &AppState) -> Result<Arc<crate::memory::MemoryService>, ApiError> {
    state.memory.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "long-term memory is not enabled on this server",
        )
    })
}

/// `GET /v1/memory/search?user=&q=&limit=&character=&guild=&channel=&as_of=&ranker=`: the
/// caller's own memories and dialogue, ranked (seed 002's dashboard search).
async fn memory_search(
    State(state): State<AppState>,
    Query(p): Query<crate::memory::http::SearchParams>,
) -> Result<Response, ApiError> {
    let svc = memory_service(&state)?;
    let found = crate::memory::http::search(state.pool.clone(), &svc, p).await?;
    Ok(Json(found).into_response())
}

/// `GET /v1/memory?user=&character=&guild=`: the caller's MEMORY.md-style snapshot.
async fn memory_snapshot(
    State(state): State<AppState>,
    Query(p): Query<crate::memory::http::SnapshotParams>,
) -> Result<Response, ApiError> {
    let svc = memory_service(&state)?;
    let snap = crate::memory::http::snapshot(state.pool.clone(), &svc, p).await?;
    Ok(Json(snap).into_response())
}

/// `POST /v1/memory/refresh?user=…`: archive, fold near-duplicates, re-render.
async fn memory_refresh(
    State(state): State<AppState>,
    Query(p): Query<crate::memory::http::SnapshotParams>,
) -> Result<Response, ApiError> {
    let svc = memory_service(&state)?;
    let done = crate::memory::http::refresh(state.pool.clone(), &svc, p).await?;
    Ok(Json(done).into_response())
}
