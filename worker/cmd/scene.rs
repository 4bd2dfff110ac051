//! What every demo scene shares: the demo's error, its character, and waiting for a
//! queued turn to finish. Its own file so the scenes and the demo that runs them import it
//! and not each other.

use std::time::Duration;

use sqlx::PgPool;

use crate::characters::{self, CharacterError};
use crate::config::ConfigError;
use crate::queue::{self, QueueError, TurnId};

/// Why the demo stopped.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("running {script}: {source}")]
    Script {
        script: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{script} failed: {stderr}")]
    ScriptFailed {
        script: &'static str,
        stderr: String,
    },
    #[error("ops/pg start printed no URL")]
    NoUrl,
    #[error(transparent)]
    Settings(#[from] ConfigError),
    #[error(transparent)]
    System(#[from] crate::system::SystemError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Character(#[from] CharacterError),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Summary(#[from] crate::summary::SummaryError),
    #[error("memory: {0}")]
    Memory(String),
    #[error("printing the report: {0}")]
    Json(#[from] serde_json::Error),
    #[error("kv directory: {0}")]
    Io(#[from] std::io::Error),
    #[error("turn {id} {state}: {error:?}")]
    Turn {
        id: TurnId,
        state: String,
        error: Option<String>,
    },
    #[error("{0}")]
    Timeout(&'static str),
    #[error(
        "DATABASE_URL's database already holds {0} turn(s): the demo runs a full worker on it, \
         which would claim and answer any turn queued there. Unset DATABASE_URL for a \
         throwaway Postgres, or pass --force to run on this database anyway"
    )]
    HoldsTurns(i64),
}

pub type Result<T, E = DemoError> = std::result::Result<T, E>;

/// The scenes' character (Captain Vega, with a sword), owned by `user`.
pub(super) async fn demo_character(pool: &PgPool, user: &str) -> Result<i64> {
    Ok(characters::add_demo(pool, user).await?)
}

pub(super) async fn wait_done(pool: &PgPool, id: TurnId) -> Result<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    loop {
        let (state, reply, error) = queue::turn_outcome(pool, id).await?;
        match state.as_str() {
            "done" => return Ok(reply.unwrap_or_default()),
            "failed" | "dead" => return Err(DemoError::Turn { id, error, state }),
            _ if std::time::Instant::now() > deadline => {
                return Err(DemoError::Timeout(
                    "a demo turn did not finish in 10 minutes",
                ))
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
