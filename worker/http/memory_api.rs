//! The memory endpoints of seed 002's dashboard API as plain async functions, so the HTTP
//! server mounts them under `/v1/memory/*` with its own routing and authentication.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::memory::ingest::jobs;
use crate::memory::notes::todos;
use crate::memory::search::{self, SearchRequest, SearchResponse};
use crate::memory::store::Scope;
use crate::memory::{render, store, MemoryError, MemoryService, RankerKind};

/// An HTTP-facing error with its status code.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl HttpError {
    pub fn status(&self) -> u16 {
        match self {
            HttpError::BadRequest(_) => 400,
            HttpError::NotFound(_) => 404,
            HttpError::Internal(_) => 500,
        }
    }
}

pub type Result<T, E = HttpError> = std::result::Result<T, E>;

impl From<MemoryError> for HttpError {
    fn from(e: MemoryError) -> Self {
        match e {
            MemoryError::Invalid(m) => HttpError::BadRequest(m),
            MemoryError::NotFound(m) => HttpError::NotFound(m),
            other => HttpError::Internal(other.to_string()),
        }
    }
}

/// `GET /v1/memory/search?user=&q=&limit=&character=&guild=&channel=&as_of=&ranker=&strict=`
#[derive(Debug, Clone, Deserialize)]
pub struct SearchParams {
    /// Set by the route from the caller (`http::identity`), never trusted as sent.
    #[serde(default)]
    pub user: String,
    pub q: String,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub character: Option<i64>,
    #[serde(default)]
    pub guild: Option<String>,
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub as_of: Option<DateTime<Utc>>,
    #[serde(default)]
    pub ranker: Option<String>,
    #[serde(default)]
    pub strict: bool,
}

fn scope(
    user: &str,
    character: Option<i64>,
    guild: Option<String>,
    channel: Option<String>,
) -> Scope {
    Scope {
        user_id: user.to_string(),
        character_id: character,
        guild_id: guild,
        channel_id: channel,
    }
}

pub async fn search(_pool: PgPool, svc: &MemoryService, p: SearchParams) -> Result<SearchResponse> {
    let ranker = match &p.ranker {
        Some(r) => RankerKind::parse(r)?,
        None => svc.config.ranker,
    };
    // Seed 002 clamps the dashboard's limit to 1..24.
    let req = SearchRequest {
        scope: scope(&p.user, p.character, p.guild, p.channel),
        query: p.q,
        limit: p.limit.unwrap_or(8).clamp(1, 24),
        as_of: p.as_of,
        ranker,
        strict: p.strict,
        skip_speaker: None,
    };
    Ok(search::search(svc, &req).await?)
}

/// `GET /v1/memory?user=&character=&guild=`: the MEMORY.md-style snapshot.
#[derive(Debug, Clone, Deserialize)]
pub struct SnapshotParams {
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub character: Option<i64>,
    #[serde(default)]
    pub guild: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub user: String,
    pub markdown: String,
}

pub async fn snapshot(pool: PgPool, _svc: &MemoryService, p: SnapshotParams) -> Result<Snapshot> {
    let s = scope(&p.user, p.character, p.guild, None);
    let markdown = render::snapshot(&pool, &s).await?;
    Ok(Snapshot {
        user: p.user,
        markdown,
    })
}

/// `POST /v1/memory/refresh`: archive (keep-80/120), fold near-duplicates, re-render.
#[derive(Debug, Clone, Serialize)]
pub struct Refreshed {
    pub archived: u64,
    pub folded: Vec<i64>,
    pub snapshot: Snapshot,
}

pub async fn refresh(pool: PgPool, svc: &MemoryService, p: SnapshotParams) -> Result<Refreshed> {
    let s = scope(&p.user, p.character, p.guild.clone(), None);
    s.validate()?;
    let archived =
        store::archive_keep(&pool, &p.user, svc.config.keep_user, svc.config.keep_lore).await?;
    let folded = jobs::curate(svc, &s).await?;
    let snapshot = snapshot(pool, svc, p).await?;
    Ok(Refreshed {
        archived,
        folded,
        snapshot,
    })
}

/// `GET /v1/memory/todos?user=&character=&all=`: seed 001's todos of one user with one
/// character (open ones unless `all`). Persona-scoped: the character is required.
#[derive(Debug, Clone, Deserialize)]
pub struct TodoParams {
    #[serde(default)]
    pub user: String,
    pub character: i64,
    #[serde(default)]
    pub all: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Todos {
    pub user: String,
    pub character: i64,
    pub todos: Vec<todos::Todo>,
}

pub async fn todos(pool: PgPool, p: TodoParams) -> Result<Todos> {
    store::Scope::user(&p.user).validate()?;
    let todos = todos::list(&pool, &p.user, p.character, !p.all).await?;
    Ok(Todos {
        user: p.user,
        character: p.character,
        todos,
    })
}
