//! `POST /v1/erase`: a user asks to be forgotten, or to forget one of their characters or
//! sessions. Behind the server's token like every route, and walled like them: a character
//! or session of another user answers as one that does not exist, and nothing is erased.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::error::ApiError;
use super::identity::Caller;
use super::state::AppState;
use crate::erase::{self, EraseError, Subject};

/// The request: the user (the caller, [`super::identity`]), and at most one of a character or a
/// session of theirs. With neither, the whole user is erased.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EraseRequest {
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    character_id: Option<i64>,
    #[serde(default)]
    session_id: Option<String>,
}

pub(super) async fn erase_route(
    State(state): State<AppState>,
    caller: Caller,
    body: Result<Json<EraseRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let user = caller.user(req.user.as_deref())?;
    let subject = match (req.character_id, req.session_id) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give `character_id` or `session_id`, not both",
            ))
        }
        (Some(c), None) => {
            if erase::owns_character(&state.pool, &user, c)
                .await
                .map_err(db)?
            {
                Subject::Character(c)
            } else if erase::is_public(&state.pool, c).await.map_err(db)? {
                // A public character is everyone's: a user forgets only their part of it.
                Subject::UserCharacter { user, character: c }
            } else {
                return Err(not_found(format!("no character {c} for this user")));
            }
        }
        (None, Some(s)) => {
            if !erase::owns_session(&state.pool, &user, &s)
                .await
                .map_err(db)?
            {
                return Err(not_found(format!("no session {s:?} for this user")));
            }
            Subject::Session {
                session: s,
                user: Some(user),
            }
        }
        (None, None) => Subject::User(user),
    };
    let store = &state.snapshots;
    match erase::erase(&state.pool, store, &subject).await {
        Ok(done) => Ok(Json(done).into_response()),
        Err(EraseError::Invalid(m)) => Err(ApiError::bad_request(m)),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("{e}; erasing again is safe"),
        )),
    }
}

fn not_found(message: String) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
}

fn db(e: sqlx::Error) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        format!("database: {e}"),
    )
}
