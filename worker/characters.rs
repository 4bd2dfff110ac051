//! Characters managed without SQL: an operator adds, lists, edits and removes them
//! (`kvmem character`), a user their own (`/v1/characters`). A character is owned by one
//! user, or public: anyone may talk to it, each user with their own sessions and memory.

use serde::Serialize;
use sqlx::PgPool;

use crate::erase::{self, EraseError, Erased, Subject};
use crate::snapshot::SnapshotStore;

/// The longest name and persona a character takes (the name is a model id in front-ends).
pub const MAX_NAME_CHARS: usize = 64;
pub const MAX_PERSONA_CHARS: usize = 8_000;

#[derive(Debug, thiserror::Error)]
pub enum CharacterError {
    #[error("{0}")]
    Invalid(String),
    /// No such character, or not the caller's to change (reported alike).
    #[error("no character {0} for this user")]
    NotFound(i64),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Erase(#[from] EraseError),
}

/// A character as the commands and routes show it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Character {
    pub id: i64,
    /// Who owns it, or who set up a public one.
    pub user_id: String,
    pub name: String,
    pub persona: String,
    pub public: bool,
    pub created: i64,
}

/// A change to a character; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct Edit {
    pub name: Option<String>,
    pub persona: Option<String>,
    pub public: Option<bool>,
}

fn check(name: Option<&str>, persona: Option<&str>) -> Result<(), CharacterError> {
    if let Some(name) = name {
        let n = name.trim().chars().count();
        if n == 0 || n > MAX_NAME_CHARS || name.chars().any(char::is_control) {
            return Err(CharacterError::Invalid(format!(
                "a character's name is 1 to {MAX_NAME_CHARS} characters without control characters"
            )));
        }
    }
    if let Some(persona) = persona {
        if persona.chars().count() > MAX_PERSONA_CHARS
            || persona
                .chars()
                .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
        {
            return Err(CharacterError::Invalid(format!(
                "a persona is at most {MAX_PERSONA_CHARS} characters, without control characters but tab, CR and LF"
            )));
        }
    }
    Ok(())
}

/// Adds a character owned by `owner` (or, public, set up by `owner`).
pub async fn add(
    pool: &PgPool,
    owner: &str,
    name: &str,
    persona: &str,
    public: bool,
) -> Result<Character, CharacterError> {
    if owner.trim().is_empty() {
        return Err(CharacterError::Invalid("a character needs an owner".into()));
    }
    check(Some(name), Some(persona))?;
    Ok(sqlx::query_as(include_str!("../sql/characters/add.sql"))
        .bind(owner)
        .bind(name.trim())
        .bind(persona)
        .bind(public)
        .fetch_one(pool)
        .await?)
}

/// The characters `user` may talk to (public and their own); with no user, the public
/// ones, or every character when `all` (an operator).
pub async fn list(
    pool: &PgPool,
    user: Option<&str>,
    all: bool,
) -> Result<Vec<Character>, CharacterError> {
    Ok(sqlx::query_as(include_str!("../sql/characters/list.sql"))
        .bind(user)
        .bind(all)
        .fetch_all(pool)
        .await?)
}

/// One character `user` may see (their own or a public one; `None`: an operator, any).
pub async fn get(pool: &PgPool, id: i64, user: Option<&str>) -> Result<Character, CharacterError> {
    sqlx::query_as(include_str!("../sql/characters/get.sql"))
        .bind(id)
        .bind(user)
        .fetch_optional(pool)
        .await?
        .ok_or(CharacterError::NotFound(id))
}

/// Edits character `id`, when it is `owner`'s own (`None`: an operator, any character).
/// A user cannot make a character public: that is an operator's choice for everyone.
pub async fn edit(
    pool: &PgPool,
    id: i64,
    owner: Option<&str>,
    change: &Edit,
) -> Result<Character, CharacterError> {
    check(change.name.as_deref(), change.persona.as_deref())?;
    if owner.is_some() && change.public.is_some() {
        return Err(CharacterError::Invalid(
            "only an operator makes a character public or owned (kvmem character edit)".into(),
        ));
    }
    sqlx::query_as(include_str!("../sql/characters/edit.sql"))
        .bind(id)
        .bind(change.name.as_deref().map(str::trim))
        .bind(change.persona.as_deref())
        .bind(change.public)
        .bind(owner)
        .fetch_optional(pool)
        .await?
        .ok_or(CharacterError::NotFound(id))
}

/// Removes character `id` with every user's data of it (the character erase), when it is
/// `owner`'s own (`None`: an operator, any, public ones included).
pub async fn remove(
    pool: &PgPool,
    store: &SnapshotStore,
    id: i64,
    owner: Option<&str>,
) -> Result<Erased, CharacterError> {
    let c = get(pool, id, owner).await?;
    if owner.is_some_and(|o| c.public || c.user_id != o) {
        return Err(CharacterError::NotFound(id));
    }
    Ok(erase::erase(pool, store, &Subject::Character(id)).await?)
}
