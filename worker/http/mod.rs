//! Seed 000's kvserver interface over HTTP: an OpenAI-compatible chat endpoint that
//! enqueues through the same SQL path as any backend and waits for the fenced completion
//! (or relays the reply as it is generated), plus rotate-hint, info and Prometheus metrics.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::Value;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::{broadcast, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::config::Settings;
use crate::queue;

mod answer;
mod characters;
mod chat;
mod conversation;
mod erase;
mod error;
mod hint;
mod identity;
mod memory;
pub mod memory_api;
mod models;
mod ops;
mod request;
mod sse;
mod state;

use chat::chat;
use erase::erase_route;
use error::ApiError;
use hint::rotate_hint;
use memory::{memory_refresh, memory_search, memory_snapshot, memory_summary, memory_todos};
use ops::{info, metrics};
pub use state::AppState;

/// The routes, behind the bearer token (when configured), the in-flight limit and the
/// body size limit.
pub fn router(state: AppState) -> Router {
    let in_flight = Arc::new(Semaphore::new(state.settings.http.max_in_flight as usize));
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models::models))
        .route(
            "/v1/characters",
            get(characters::list).post(characters::create),
        )
        .route(
            "/v1/characters/{id}",
            get(characters::get)
                .patch(characters::edit)
                .delete(characters::remove),
        )
        .route("/v1/rotate-hint", get(rotate_hint))
        .route("/v1/info", get(info))
        .route("/metrics", get(metrics))
        .route("/v1/memory/search", get(memory_search))
        .route("/v1/memory", get(memory_snapshot))
        .route("/v1/memory/refresh", post(memory_refresh))
        .route("/v1/memory/summary", get(memory_summary))
        .route("/v1/memory/todos", get(memory_todos))
        .route("/v1/erase", post(erase_route))
        .layer(DefaultBodyLimit::max(state.settings.http.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            identity::authorize,
        ))
        .layer(middleware::from_fn_with_state(in_flight, limit_in_flight))
        .with_state(state)
}

/// Refuses at once beyond `http.max_in_flight` requests: a client retrying on 503 is
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

/// Why `kvmem serve` must not start on this address with these settings, if it must not:
/// beyond loopback, the API is only served behind a bearer token.
pub fn check_exposure(
    addr: &std::net::SocketAddr,
    settings: &Settings,
) -> Result<(), ExposureError> {
    let has_token = settings
        .http
        .token
        .as_deref()
        .is_some_and(|t| !t.trim().is_empty());
    if addr.ip().is_loopback() || has_token {
        Ok(())
    } else {
        Err(ExposureError(*addr))
    }
}

/// A listen address beyond loopback without a bearer token.
#[derive(Debug, thiserror::Error)]
#[error("refusing to listen on {0} without KVMEM_HTTP_TOKEN: beyond loopback the API needs a bearer token")]
pub struct ExposureError(std::net::SocketAddr);

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
