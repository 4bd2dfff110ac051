//! Characters are models: `GET /v1/models` lists the caller's characters, a chat request's
//! `model` picks one of them by the id listed (or the character's numeric id), and the
//! request's system message may become the picked character's persona.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use sqlx::PgPool;

use super::error::ApiError;
use super::state::{header, AppState};

/// One of the user's characters.
#[derive(Debug, sqlx::FromRow)]
struct Character {
    id: i64,
    name: String,
    created: i64,
}

/// A character with the model id it is listed under.
struct Listed {
    model: String,
    character: Character,
}

/// The user's characters, each under its name, or `name#id` where its name alone would
/// not pick it (another of the user's characters has it, or it reads as a number).
async fn listed(pool: &PgPool, user: &str) -> Result<Vec<Listed>, sqlx::Error> {
    let all: Vec<Character> = sqlx::query_as(include_str!("../../sql/http/models.sql"))
        .bind(user)
        .fetch_all(pool)
        .await?;
    let shared = |c: &Character| {
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

#[derive(Deserialize)]
pub(super) struct ModelsQuery {
    #[serde(default)]
    user: Option<String>,
}

/// `GET /v1/models?user=`: the caller's characters in OpenAI's list shape. The user is the
/// `user` query parameter or the `http.user_header` header.
pub(super) async fn models(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<ModelsQuery>,
) -> Result<Response, ApiError> {
    let user = q
        .user
        .or_else(|| header(&headers, &state.settings.http.user_header))
        .filter(|u| !u.trim().is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "missing user id (query `user` or header {})",
                state.settings.http.user_header
            ))
        })?;
    let data: Vec<_> = listed(&state.pool, &user)
        .await?
        .into_iter()
        .map(|l| {
            json!({
                "id": l.model,
                "object": "model",
                "created": l.character.created,
                "owned_by": user,
                "kvmem": { "character_id": l.character.id, "name": l.character.name },
            })
        })
        .collect();
    Ok(Json(json!({ "object": "list", "data": data })).into_response())
}

/// The character `model` names for `user`: by a model id `/v1/models` lists, or by the
/// character's numeric id. Anything else is a 404 listing the user's models, so a
/// mistyped name says what there is to pick from.
pub(super) async fn select(pool: &PgPool, user: &str, model: &str) -> Result<i64, ApiError> {
    let all = listed(pool, user).await?;
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
        "none: this user has no characters".to_string()
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
/// (the enqueue refuses that one).
pub(super) async fn set_persona(
    pool: &PgPool,
    character: i64,
    user: &str,
    persona: &str,
) -> Result<(), ApiError> {
    sqlx::query(include_str!("../../sql/http/set_persona.sql"))
        .bind(character)
        .bind(user)
        .bind(persona)
        .execute(pool)
        .await?;
    Ok(())
}
