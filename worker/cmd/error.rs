//! Why a command of the `kvmem` binary failed: one error for the commands `main.rs`
//! dispatches to, each case saying what was being done, so the message a person sees at
//! the shell names the step that failed.

use crate::cmd::replay::ReplayError;
use crate::db::DbError;
use crate::erase::EraseError;
use crate::http::ExposureError;
use crate::queue::QueueError;
use crate::runner::WorkerError;
use crate::system::SystemError;

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    System(#[from] SystemError),
    /// The database could not be reached or migrated before a long-running command began.
    #[error("connecting and migrating before start: {0}")]
    Start(#[source] SystemError),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Migrate(#[from] DbError),
    /// The database refused the request; its own message (`kvmem: ...`) is the answer.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error(transparent)]
    Erase(#[from] EraseError),
    #[error(transparent)]
    Exposure(#[from] ExposureError),
    /// An I/O step, named.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// The in-process worker's task panicked or was cancelled.
    #[error("in-process worker: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// What the command was asked is not possible, or it ran and found a failure (a replay
    /// check that diverged): the message says which.
    #[error("{0}")]
    Failed(String),
}

impl CommandError {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CommandError {
        let what = what.into();
        move |source| CommandError::Io { what, source }
    }
}

impl From<QueueError> for CommandError {
    /// The database's own message for a raised error (our `kvmem: ...` texts), else the
    /// whole error.
    fn from(e: QueueError) -> CommandError {
        CommandError::Refused(match e {
            QueueError::Db(sqlx::Error::Database(d)) => d.message().to_string(),
            other => other.to_string(),
        })
    }
}
