//! `/v1/info` and `/metrics`: what an operator or a scraper asks of a running server.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::{queue, snapshot};

use super::error::ApiError;
use super::state::AppState;

/// `GET /v1/info`: the system fingerprint and effective configuration (no secrets).
pub(super) async fn info(State(state): State<AppState>) -> Result<Response, ApiError> {
    let s = &state.settings;
    let bpt = queue::recent_bpt(&state.pool).await?;
    let nested = serde_json::to_value(s.as_ref()).unwrap_or(Value::Null);
    let mut config = crate::config::keys::flat_json(&nested);
    // The URL may carry a password.
    config.remove("database_url");
    let devices: serde_json::Map<String, Value> = state
        .placements
        .iter()
        .map(|(role, p)| (role.to_string(), json!(p)))
        .collect();
    // The chat model's backend, else the first model's; "none" when none is loaded here.
    let backend = state
        .placements
        .iter()
        .find(|(role, _)| *role == "chat")
        .or(state.placements.first())
        .map_or("none", |(_, p)| p.backend.as_str());
    Ok(Json(json!({
        "service": "kvmem",
        "version": env!("CARGO_PKG_VERSION"),
        "model_sha": state.model_sha,
        "model_path": s.engine.model_path,
        "llama_build": crate::engine::LLAMA_BUILD,
        "snapshot_format": format!("{} v{}", snapshot::MAGIC, snapshot::FORMAT_VERSION),
        "kv_type_k": s.engine.kv_type.as_str(),
        "kv_type_v": s.engine.kv_type.as_str(),
        "bpt": bpt,
        "backend": backend,
        "devices": devices,
        "config": config,
    }))
    .into_response())
}

pub(super) async fn metrics(
    State(state): State<AppState>,
    caller: super::identity::Caller,
) -> Result<Response, ApiError> {
    // The queue's counts span every user: an operator's view, not a user key's.
    if !caller.is_operator() {
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "permission_error",
            "/metrics is for the service token, not a user's key",
        ));
    }
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
