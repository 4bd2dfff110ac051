//! Per-user API keys: the credential that makes a request its user's own when
//! `http.identity` is `key`, so a front-end's users can hold keys instead of sharing the
//! service token. A key is shown once, at creation; only its SHA-256 is stored.

use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

/// What every key starts with, so a leaked one is recognisable in logs and by scanners.
pub const KEY_PREFIX: &str = "kvmem_";
/// How many characters of a key `kvmem keys list` shows to tell keys apart.
const SHOWN: usize = 14;
/// The longest user id a key may name: the ids' indexes and the HTTP limit agree on it.
pub const MAX_USER_BYTES: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("invalid: {0}")]
    Invalid(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// A key as listed: everything but the key.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct KeyInfo {
    pub id: i64,
    pub user_id: String,
    pub label: String,
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A new key for `user`: its row id and the key, which is not stored and cannot be shown again.
pub async fn create(pool: &PgPool, user: &str, label: &str) -> Result<(i64, String), KeyError> {
    if user.trim().is_empty() || user.len() > MAX_USER_BYTES || user.chars().any(char::is_control) {
        return Err(KeyError::Invalid(format!(
            "a user id is 1 to {MAX_USER_BYTES} bytes without control characters"
        )));
    }
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let key = format!("{KEY_PREFIX}{}", hex::encode(secret));
    let id = sqlx::query_scalar(include_str!("../sql/keys/create.sql"))
        .bind(user)
        .bind(label)
        .bind(&key[..SHOWN])
        .bind(digest(&key))
        .fetch_one(pool)
        .await?;
    Ok((id, key))
}

/// The keys of `user`, or of everyone.
pub async fn list(pool: &PgPool, user: Option<&str>) -> Result<Vec<KeyInfo>, KeyError> {
    Ok(sqlx::query_as(include_str!("../sql/keys/list.sql"))
        .bind(user)
        .fetch_all(pool)
        .await?)
}

/// Revokes key `id`; the user it belonged to, or None when there is no such key.
pub async fn revoke(pool: &PgPool, id: i64) -> Result<Option<String>, KeyError> {
    Ok(sqlx::query_scalar(include_str!("../sql/keys/revoke.sql"))
        .bind(id)
        .fetch_optional(pool)
        .await?)
}

/// The user a presented key belongs to, if it is a live key. Anything not shaped like a
/// key is answered without a query.
pub async fn user_of(pool: &PgPool, presented: &str) -> Result<Option<String>, KeyError> {
    if !presented.starts_with(KEY_PREFIX) || presented.len() > 128 {
        return Ok(None);
    }
    Ok(sqlx::query_scalar(include_str!("../sql/keys/lookup.sql"))
        .bind(digest(presented))
        .fetch_optional(pool)
        .await?)
}

fn digest(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}
