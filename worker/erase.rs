//! Forgetting a person: one user, one of their characters or one session erased from every
//! table (one SQL function, `sql/api/erase.sql`) and from every snapshot store (files,
//! their quarantined copies, objects), with one audit event that holds no content. The
//! CLI, the HTTP route and the workers' maintenance sweep all come through here.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;

use crate::snapshot::{ScopeErased, SnapshotStore};

/// What to erase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// The user and everything of theirs: characters, sessions, memories, summaries.
    User(String),
    /// One character: its sessions and what was kept or derived from them, every user's
    /// (a public character's too), and the character.
    Character(i64),
    /// One user's part of a character (a public one they talked to): their sessions with
    /// it and what came of them; the character and other users' parts stay.
    UserCharacter { user: String, character: i64 },
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
    /// The audit event's subject: the kind and a keyed hash of the id (HMAC-SHA-256).
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
        Subject::UserCharacter { user, character } => {
            sqlx::query_scalar(include_str!("../sql/erase/user_character.sql"))
                .bind(user.as_str())
                .bind(*character)
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

/// How far one worker's sweep of erased scopes has come, so each scope is swept once per
/// worker instead of on every pass: the newest erase time swept, and the scopes of the
/// last ten minutes (the overlap) already done (read again, not swept again).
#[derive(Debug, Default)]
pub struct SweepMark {
    swept_to: Option<DateTime<Utc>>,
    recent: HashMap<String, DateTime<Utc>>,
}

/// An erase stamps `erased_at` when its transaction starts and may commit later, after a
/// sweep read past the stamp; each sweep reads back this far for such late commits.
const SWEEP_OVERLAP: Duration = Duration::from_secs(600);

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Swept {
    /// Scopes swept for the first time by this worker.
    pub scopes: usize,
    pub removed: ScopeErased,
}

/// A worker's sweep of the erased scopes it has not swept yet: removes whatever its store
/// still holds of them that was written before their erase (a copy in its own directory,
/// a file a turn in flight wrote), never a snapshot of a session id used again after the
/// erase; and forgets scopes erased longer than `keep` ago.
pub async fn sweep(
    pool: &PgPool,
    store: &SnapshotStore,
    keep: Duration,
    mark: &mut SweepMark,
) -> Result<Swept, EraseError> {
    let overlap = chrono::Duration::from_std(SWEEP_OVERLAP).unwrap_or_default();
    let from = mark.swept_to.map(|t| t - overlap);
    let rows: Vec<(String, DateTime<Utc>)> =
        sqlx::query_as(include_str!("../sql/erase/scopes.sql"))
            .bind(from)
            .fetch_all(pool)
            .await?;
    let fresh: HashMap<String, u64> = rows
        .iter()
        .filter(|(scope, _)| !mark.recent.contains_key(scope))
        // Rounded up: a file stamped in the erase's own millisecond was written before it.
        .map(|(scope, at)| {
            let millis = (at.timestamp_micros().max(0) as u64).div_ceil(1000);
            (scope.clone(), millis)
        })
        .collect();
    let swept = Swept {
        scopes: fresh.len(),
        removed: if fresh.is_empty() {
            ScopeErased::default()
        } else {
            store
                .erase_written_before(fresh)
                .await
                .map_err(|error| EraseError::Store {
                    scope: format!("{} erased scopes", rows.len()),
                    error,
                })?
        },
    };
    for (scope, at) in rows {
        mark.swept_to = Some(mark.swept_to.map_or(at, |t| t.max(at)));
        mark.recent.insert(scope, at);
    }
    if let Some(to) = mark.swept_to {
        mark.recent.retain(|_, at| *at > to - overlap);
    }
    sqlx::query(include_str!("../sql/erase/forget_scopes.sql"))
        .bind(keep.as_secs_f64())
        .execute(pool)
        .await?;
    Ok(swept)
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

/// Whether `character` is public: anyone may talk to it, and a user's erase of it is of
/// their part.
pub async fn is_public(pool: &PgPool, character: i64) -> sqlx::Result<bool> {
    sqlx::query_scalar(include_str!("../sql/erase/is_public.sql"))
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
