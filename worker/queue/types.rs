//! What the queue's files share: its error, and the lease and backoff timing.

use crate::turn::TurnId;

/// Queue errors. `Fenced` means another worker owns the session now: drop the work.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("lease lost for turn {0}: another worker owns the session now")]
    Fenced(TurnId),
    #[error("the worker's commit queue has stopped")]
    Stopped,
    /// The request asks for what the queue refuses to hold (a bound it passes).
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = QueueError> = std::result::Result<T, E>;

impl QueueError {
    /// The database's error as it is, for a caller that speaks `sqlx::Error` (a read fails
    /// only with one); any other case as a protocol error with its message.
    pub fn into_db(self) -> sqlx::Error {
        match self {
            QueueError::Db(e) => e,
            other => sqlx::Error::Protocol(other.to_string()),
        }
    }
}

/// Lease and backoff settings, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct QueueTiming {
    pub lease_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
}
