//! `/v1/memory/*`: the long-term memory's search, snapshot and refresh, the todos, and the
//! summaries a new session starts from, behind the server's auth and scoped to the asking user.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::ApiError;
use super::identity::Caller;
use super::state::AppState;

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
pub(super) async fn memory_search(
    State(state): State<AppState>,
    caller: Caller,
    Query(mut p): Query<super::memory_api::SearchParams>,
) -> Result<Response, ApiError> {
    p.user = caller.user(None)?;
    let svc = memory_service(&state)?;
    let found = super::memory_api::search(state.pool.clone(), &svc, p).await?;
    Ok(Json(found).into_response())
}

/// `GET /v1/memory?user=&character=&guild=`: the caller's MEMORY.md-style snapshot.
pub(super) async fn memory_snapshot(
    State(state): State<AppState>,
    caller: Caller,
    Query(mut p): Query<super::memory_api::SnapshotParams>,
) -> Result<Response, ApiError> {
    p.user = caller.user(None)?;
    let svc = memory_service(&state)?;
    let snap = super::memory_api::snapshot(state.pool.clone(), &svc, p).await?;
    Ok(Json(snap).into_response())
}

/// `POST /v1/memory/refresh?user=…`: archive, fold near-duplicates, re-render.
pub(super) async fn memory_refresh(
    State(state): State<AppState>,
    caller: Caller,
    Query(mut p): Query<super::memory_api::SnapshotParams>,
) -> Result<Response, ApiError> {
    p.user = caller.user(None)?;
    let svc = memory_service(&state)?;
    let done = super::memory_api::refresh(state.pool.clone(), &svc, p).await?;
    Ok(Json(done).into_response())
}

/// `GET /v1/memory/summary?user=&character=` query.
#[derive(Debug, Clone, serde::Deserialize)]
pub(super) struct SummaryParams {
    #[serde(default)]
    user: String,
    character: i64,
}

/// `GET /v1/memory/summary?user=&character=`: the caller's latest session summary, rolling
/// summary and spine for one of the caller's characters (404 for anyone else's).
pub(super) async fn memory_summary(
    State(state): State<AppState>,
    caller: Caller,
    Query(mut p): Query<SummaryParams>,
) -> Result<Response, ApiError> {
    p.user = caller.user(None)?;
    let context = crate::summary::session_context::load(&state.pool, &p.user, p.character).await?;
    Ok(Json(context).into_response())
}

/// `GET /v1/memory/todos?user=&character=&all=`: the caller's todos with one of their
/// characters (an empty list for a character they never spoke to).
pub(super) async fn memory_todos(
    State(state): State<AppState>,
    caller: Caller,
    Query(mut p): Query<super::memory_api::TodoParams>,
) -> Result<Response, ApiError> {
    p.user = caller.user(None)?;
    let todos = super::memory_api::todos(state.pool.clone(), p).await?;
    Ok(Json(todos).into_response())
}
