//! `/v1/characters`: a user manages their own characters, behind the identity rules of
//! every route; the list also holds the public ones, which only an operator changes.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::identity::Caller;
use super::state::AppState;
use crate::characters::{self, CharacterError, Edit};

impl From<CharacterError> for ApiError {
    fn from(e: CharacterError) -> ApiError {
        match e {
            CharacterError::Invalid(m) => ApiError::bad_request(m),
            CharacterError::NotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found_error", e.to_string())
            }
            other => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                other.to_string(),
            ),
        }
    }
}

/// A character query's error on the chat path (`may_talk`, the model list, the persona):
/// a database error answers there as every other database error of that path does
/// (`ApiError`'s `From<sqlx::Error>`, which tells a request's bad bytes from a failure),
/// not as a `/v1/characters` route's.
pub(super) fn lookup_error(e: CharacterError) -> ApiError {
    match e {
        CharacterError::Db(e) => ApiError::from(e),
        other => ApiError::from(other),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewCharacter {
    #[serde(default)]
    user: Option<String>,
    name: String,
    #[serde(default)]
    persona: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CharacterChange {
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    persona: Option<String>,
}

type Body<T> = Result<Json<T>, axum::extract::rejection::JsonRejection>;

fn body<T>(b: Body<T>) -> Result<T, ApiError> {
    b.map(|Json(t)| t)
        .map_err(|e| ApiError::bad_request(e.body_text()))
}

/// `GET /v1/characters`: the public characters and the caller's own.
pub(super) async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let user = caller.maybe_user(None)?;
    let data = characters::list(&state.pool, user.as_deref(), false).await?;
    Ok(Json(json!({ "data": data })).into_response())
}

/// `POST /v1/characters`: a new character of the caller's own.
pub(super) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    new: Body<NewCharacter>,
) -> Result<Response, ApiError> {
    let new = body(new)?;
    let user = caller.user(new.user.as_deref())?;
    let c = characters::add(&state.pool, &user, &new.name, &new.persona, false).await?;
    Ok((StatusCode::CREATED, Json(c)).into_response())
}

/// `GET /v1/characters/{id}`: one the caller may talk to.
pub(super) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Result<Response, ApiError> {
    let user = caller.maybe_user(None)?;
    // Without a user only public characters are visible.
    let c = characters::get(&state.pool, id, Some(user.as_deref().unwrap_or(""))).await?;
    Ok(Json(c).into_response())
}

/// `PATCH /v1/characters/{id}`: the caller's own character's name or persona.
pub(super) async fn edit(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    change: Body<CharacterChange>,
) -> Result<Response, ApiError> {
    let change = body(change)?;
    let user = caller.user(change.user.as_deref())?;
    let edit = Edit {
        name: change.name,
        persona: change.persona,
        public: None,
    };
    let c = characters::edit(&state.pool, id, Some(&user), &edit).await?;
    Ok(Json(c).into_response())
}

/// `DELETE /v1/characters/{id}`: the caller's own character and everything of it (the
/// character erase). A public character is not the caller's: 404.
pub(super) async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Result<Response, ApiError> {
    let user = caller.user(None)?;
    let store = &state.snapshots;
    let done = characters::remove(&state.pool, store, id, Some(&user)).await?;
    Ok(Json(done).into_response())
}
