//! Characters managed without SQL: an operator adds, lists, edits and removes them
//! (`kvmem character`), a user their own (`/v1/characters`). A character is owned by one
//! user, or public: anyone may talk to it, each user with their own sessions and memory.
//! What the chat endpoint asks of them (may this user talk to it, which ones are models, a
//! system message as a persona) and the demo's character are here too: the faces run no
//! SQL of their own on `user_characters`.

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

/// Whether `user` may talk to `character`: their own, or a public one
/// (`sql/characters/character_owned.sql`).
pub async fn may_talk(pool: &PgPool, character: i64, user: &str) -> Result<bool, CharacterError> {
    Ok(
        sqlx::query_scalar(include_str!("../sql/characters/character_owned.sql"))
            .bind(character)
            .bind(user)
            .fetch_one(pool)
            .await?,
    )
}

/// A character a user may talk to, as `/v1/models` lists it.
#[derive(Debug, sqlx::FromRow)]
pub struct Talkable {
    pub id: i64,
    pub name: String,
    pub created: i64,
    pub public: bool,
}

/// The characters `user` may talk to, oldest first: the public ones and their own (the
/// public ones alone without a user) (`sql/characters/models.sql`).
pub async fn talkable(pool: &PgPool, user: Option<&str>) -> Result<Vec<Talkable>, CharacterError> {
    Ok(sqlx::query_as(include_str!("../sql/characters/models.sql"))
        .bind(user)
        .fetch_all(pool)
        .await?)
}

/// Makes `persona` the persona of `character` when it is `user`'s own and the text differs;
/// otherwise writes nothing (`sql/characters/set_persona.sql`).
pub async fn set_persona(
    pool: &PgPool,
    character: i64,
    user: &str,
    persona: &str,
) -> Result<(), CharacterError> {
    sqlx::query(include_str!("../sql/characters/set_persona.sql"))
        .bind(character)
        .bind(user)
        .bind(persona)
        .execute(pool)
        .await?;
    Ok(())
}

/// Adds the demo scenes' character (Captain Vega, with a plasma rifle) owned by `user`, and
/// returns its id: the equipment first, then the character, each statement on its own
/// (`sql/characters/demo_equipment.sql`, `sql/characters/demo_character.sql`).
pub async fn add_demo(pool: &PgPool, user: &str) -> Result<i64, CharacterError> {
    let eq: i64 = sqlx::query_scalar(include_str!("../sql/characters/demo_equipment.sql"))
        .fetch_one(pool)
        .await?;
    Ok(
        sqlx::query_scalar(include_str!("../sql/characters/demo_character.sql"))
            .bind(user)
            .bind(eq)
            .fetch_one(pool)
            .await?,
    )
}
