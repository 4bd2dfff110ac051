//! Characters are models: `GET /v1/models` lists the public characters and the caller's
//! own, a chat request's `model` picks one of them by the id listed (or the character's
//! numeric id), and the request's system message may become the picked character's persona.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use sqlx::PgPool;

use super::characters::lookup_error;
use super::error::ApiError;
use super::identity::Caller;
use super::state::AppState;
use crate::characters::{self, Talkable};

/// A character with the model id it is listed under.
struct Listed {
    model: String,
    character: Talkable,
}

/// The characters `user` may talk to (the public ones alone without a user), each under its
/// name, or `name#id` where its name alone would not pick it (another listed character
/// has it, public or the user's own, or it reads as a number).
async fn listed(pool: &PgPool, user: Option<&str>) -> Result<Vec<Listed>, ApiError> {
    let all = characters::talkable(pool, user)
        .await
        .map_err(lookup_error)?;
    let shared = |c: &Talkable| {
        c.name.parse::<i64>().is_ok() || all.iter().filter(|o| o.name == c.name).count() > 1
    };
    let models: Vec<String> = all
        .iter()
        .map(|c| {
            if shared(c) {
                format!("{}#{}", c.name, c.id)
            } else {
                c.name.clone()
            }
        })
        .collect();
    Ok(models
        .into_iter()
        .zip(all)
        .map(|(model, character)| Listed { model, character })
        .collect())
}

/// `GET /v1/models`: the public characters, and the caller's own when the request names a
/// user, in OpenAI's list shape. A front-end's connection check lists models with no user.
pub(super) async fn models(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let user = caller.maybe_user(None)?;
    let data: Vec<_> = listed(&state.pool, user.as_deref())
        .await?
        .into_iter()
        .map(|l| {
            let owner = if l.character.public {
                "public"
            } else {
                user.as_deref().unwrap_or_default()
            };
            json!({
                "id": l.model,
                "object": "model",
                "created": l.character.created,
                "owned_by": owner,
                "kvmem": { "character_id": l.character.id, "name": l.character.name,
                           "public": l.character.public },
            })
        })
        .collect();
    Ok(Json(json!({ "object": "list", "data": data })).into_response())
}

/// The character `model` names for `user`: by a model id `/v1/models` lists, or by the
/// character's numeric id. Anything else is a 404 listing the user's models, so a
/// mistyped name says what there is to pick from.
pub(super) async fn select(pool: &PgPool, user: &str, model: &str) -> Result<i64, ApiError> {
    let all = listed(pool, Some(user)).await?;
    let by_model = all.iter().find(|l| l.model == model);
    let by_id = || {
        let id = model.trim().parse::<i64>().ok()?;
        all.iter().find(|l| l.character.id == id)
    };
    if let Some(l) = by_model.or_else(by_id) {
        return Ok(l.character.id);
    }
    let names: Vec<&str> = all.iter().map(|l| l.model.as_str()).collect();
    let list = if names.is_empty() {
        "none: no public character, and this user has none".to_string()
    } else {
        names.join(", ")
    };
    let mut e = ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found_error",
        format!("unknown model {model:?} for user {user}; this user's models: {list}"),
    );
    e.extra = json!({ "param": "model", "models": names });
    Err(e)
}

/// The request's system message as the character's persona (`http.system_message =
/// persona`); a no-op when it is already the persona or the character is not the user's
/// own (a public character's persona is its operator's; the enqueue refuses a foreign one).
pub(super) async fn set_persona(
    pool: &PgPool,
    character: i64,
    user: &str,
    persona: &str,
) -> Result<(), ApiError> {
    characters::set_persona(pool, character, user, persona)
        .await
        .map_err(lookup_error)
}
