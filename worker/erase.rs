//! Forgetting a person: one user, one of their characters or one session erased from every
//! table (one SQL function, `sql/api/erase.sql`) and from every snapshot store (files,
//! their quarantined copies, objects), with one audit event that holds no content. The
//! CLI, the HTTP route and the workers' maintenance sweep all come through here.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;

use crate::snapshot::{ScopeErased, SnapshotStore};

/// What to erase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// The user and everything of theirs: characters, sessions, memories, summaries.
    User(String),
    /// One character: its sessions and what was kept or derived from them.
    Character(i64),
    /// One session: its dialogue, snapshot, facts, and the memories that cite it; with a
    /// user, only that user's part (an imported session id is the user's own name for it).
    Session {
        session: String,
        user: Option<String>,
    },
}

/// What an erase removed: rows per table, and snapshot files and objects.
#[derive(Debug, Clone, Serialize)]
pub struct Erased {
    /// `user`, `character` or `session`.
    pub kind: String,
    /// The audit event's subject: the kind and the SHA-256 of the id.
    pub subject: String,
    /// Rows removed, per table (every table an erase touches, zeros included).
    pub tables: indexmap::IndexMap<String, i64>,
    /// Snapshot scopes erased.
    pub scopes: usize,
    /// Snapshot files, quarantined copies and objects removed.
    pub stores: ScopeErased,
}

impl Erased {
    /// Rows removed in all tables.
    pub fn rows(&self) -> i64 {
        self.tables.values().sum()
    }
}

/// An erase that could not be done.
#[derive(Debug, thiserror::Error)]
pub enum EraseError {
    /// The request itself is wrong (an empty id).
    #[error("{0}")]
    Invalid(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// The rows are gone, but a snapshot store could not be emptied: the workers' sweep
    /// retries it (the scope stays listed in `erased_scopes`).
    #[error("the rows are erased, but snapshot scope {scope} could not be removed: {error}")]
    Store {
        scope: String,
        error: std::io::Error,
    },
}

/// Erases `subject` from Postgres, then its snapshots from `store`.
pub async fn erase(
    pool: &PgPool,
    store: &SnapshotStore,
    subject: &Subject,
) -> Result<Erased, EraseError> {
    let query = match subject {
        Subject::User(u) => {
            sqlx::query_scalar::<_, Value>(include_str!("../sql/erase/user.sql")).bind(u.as_str())
        }
        Subject::Character(c) => {
            sqlx::query_scalar(include_str!("../sql/erase/character.sql")).bind(*c)
        }
        Subject::Session { session, user } => {
            sqlx::query_scalar(include_str!("../sql/erase/session.sql"))
                .bind(session.as_str())
                .bind(user.as_deref())
        }
    };
    let out = query.fetch_one(pool).await.map_err(|e| match &e {
        sqlx::Error::Database(d) if d.code().as_deref() == Some("22023") => {
            EraseError::Invalid(d.message().to_string())
        }
        _ => EraseError::Db(e),
    })?;
    let scopes: Vec<String> = out["scopes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let stores = erase_scopes(store, &scopes).await?;
    Ok(Erased {
        kind: out["kind"].as_str().unwrap_or_default().to_string(),
        subject: out["subject"].as_str().unwrap_or_default().to_string(),
        tables: serde_json::from_value(out["tables"].clone()).unwrap_or_default(),
        scopes: scopes.len(),
        stores,
    })
}

async fn erase_scopes(store: &SnapshotStore, scopes: &[String]) -> Result<ScopeErased, EraseError> {
    let mut total = ScopeErased::default();
    for scope in scopes {
        let one = store
            .erase(scope)
            .await
            .map_err(|error| EraseError::Store {
                scope: scope.clone(),
                error,
            })?;
        total.files += one.files;
        total.quarantined += one.quarantined;
        total.objects += one.objects;
        total.bytes += one.bytes;
    }
    Ok(total)
}

/// A worker's sweep of the erased scopes: removes whatever this worker's store still holds
/// of them (a copy in its own directory, a file a turn in flight wrote after the erase),
/// and forgets scopes erased longer than `keep` ago. Returns what it removed.
pub async fn sweep(
    pool: &PgPool,
    store: &SnapshotStore,
    keep: Duration,
) -> Result<ScopeErased, EraseError> {
    let scopes: Vec<String> = sqlx::query_scalar(include_str!("../sql/erase/scopes.sql"))
        .fetch_all(pool)
        .await?;
    let removed = erase_scopes(store, &scopes).await?;
    sqlx::query(include_str!("../sql/erase/forget_scopes.sql"))
        .bind(keep.as_secs_f64())
        .execute(pool)
        .await?;
    Ok(removed)
}

/// After a turn lost its fence: if its session was erased meanwhile, removes the snapshot
/// the turn may have written before it learnt so. True if the scope was erased.
pub async fn after_fenced(
    pool: &PgPool,
    store: &SnapshotStore,
    scope: &str,
) -> Result<bool, EraseError> {
    let erased: bool = sqlx::query_scalar(include_str!("../sql/erase/scope_erased.sql"))
        .bind(scope)
        .fetch_one(pool)
        .await?;
    if erased {
        erase_scopes(store, &[scope.to_string()]).await?;
    }
    Ok(erased)
}

/// Whether `user` owns `character` (the HTTP route's wall: another user's character
/// answers as one that does not exist).
pub async fn owns_character(pool: &PgPool, user: &str, character: i64) -> sqlx::Result<bool> {
    sqlx::query_scalar(include_str!("../sql/erase/owns_character.sql"))
        .bind(user)
        .bind(character)
        .fetch_one(pool)
        .await
}

/// Whether `session` is `user`'s: it has turns of `user` and of nobody else.
pub async fn owns_session(pool: &PgPool, user: &str, session: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar(include_str!("../sql/erase/owns_session.sql"))
        .bind(user)
        .bind(session)
        .fetch_one(pool)
        .await
}
