//! The types every layer shares about one turn: its id and state, the claim a worker
//! holds, the error an attempt ends in, and the log line it writes. Nothing here talks
//! to Postgres or llama.cpp, so the queue, the pipeline and the runner all build on it.

pub mod chain;
mod claimed;
mod lease;
pub mod log;
mod options;

use crate::engine::EngineError;
use crate::snapshot::Segment;
pub use claimed::{ClaimedTurn, LastDone, TurnId, TurnState};
pub use lease::{Lease, LeaseCheck};
use log::KvLog;
pub use options::TurnOptions;

/// The source of a turn failure, kept so the cause chain survives classification.
pub type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a turn attempt produced, for the fenced completion to commit.
#[derive(Debug, Clone)]
pub struct TurnOutput {
    pub reply: String,
    pub log: KvLog,
    /// The KV's dialogue after the turn; `None` from the echo generator.
    pub kv: Option<KvRecord>,
    /// In-chat memory commands to queue on the memory lane, in the completion's
    /// transaction: committed with the reply that acknowledges them, or not at all.
    pub memory_ops: Vec<MemoryOp>,
}

/// Memory work a turn asks for: the user's in-chat commands, and the character's own
/// memory line from the reply's hidden tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryOp {
    Remember(String),
    Forget(String),
    /// "Remember this about X": the name; the lane summarises the session's recent messages.
    RememberAbout(String),
    /// The line the reply asked to keep (seed 002's memoryLine), already stripped from it.
    Line(String),
}

impl MemoryOp {
    /// The kind `sql/queue/memory_ops.sql` queues it as, and its text.
    pub fn as_job(&self) -> (&'static str, &str) {
        match self {
            MemoryOp::Remember(t) => ("remember", t),
            MemoryOp::Forget(t) => ("forget", t),
            MemoryOp::RememberAbout(t) => ("about", t),
            MemoryOp::Line(t) => ("line", t),
        }
    }
}

/// The exact token sequence and segment table the session's KV holds after a turn (pruned,
/// HUD removed, reply closed). Committed with the turn, it makes the snapshot a cache: a
/// cold start decodes these tokens and lands on the same dialogue the warm KV holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvRecord {
    /// The model whose tokenizer produced the ids; another model cannot reuse them.
    pub model_sha: String,
    pub token_ids: Vec<i32>,
    pub segments: Vec<Segment>,
    /// The digest version the KV has seen ("" if none).
    pub digest_version: String,
}

/// A failed turn attempt, classified once: the queue retries only what may succeed later.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// Bad input that no retry can fix (a message too long for the context, say).
    #[error("{message}")]
    Fatal {
        message: String,
        #[source]
        source: Option<Source>,
        log: Option<Box<KvLog>>,
    },
    /// A database blip or an engine failure: worth another attempt after backoff.
    #[error("{message}")]
    Retryable {
        message: String,
        #[source]
        source: Option<Source>,
        log: Option<Box<KvLog>>,
    },
    /// Stopped early: the lease was lost or shutdown ran out of grace.
    #[error("turn aborted: lease lost or shutting down")]
    Aborted,
}

impl TurnError {
    pub fn fatal(message: impl Into<String>) -> TurnError {
        TurnError::Fatal {
            message: message.into(),
            source: None,
            log: None,
        }
    }

    pub fn retryable(message: impl Into<String>) -> TurnError {
        TurnError::Retryable {
            message: message.into(),
            source: None,
            log: None,
        }
    }

    /// A retryable failure caused by `source`; the message names the cause as well, since
    /// it is what the turn row and the log line show.
    pub fn retryable_from(
        context: &str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> TurnError {
        TurnError::Retryable {
            message: format!("{context}: {source}"),
            source: Some(Box::new(source)),
            log: None,
        }
    }

    /// Attaches the partial log, so the failed attempt's row shows how far it got.
    pub fn with_log(self, partial: KvLog) -> TurnError {
        match self {
            TurnError::Fatal {
                message, source, ..
            } => TurnError::Fatal {
                message,
                source,
                log: Some(Box::new(partial)),
            },
            TurnError::Retryable {
                message, source, ..
            } => TurnError::Retryable {
                message,
                source,
                log: Some(Box::new(partial)),
            },
            TurnError::Aborted => TurnError::Aborted,
        }
    }

    pub fn is_retryable(&self) -> bool {
        !matches!(self, TurnError::Fatal { .. })
    }

    pub fn log(&self) -> Option<KvLog> {
        match self {
            TurnError::Fatal { log, .. } | TurnError::Retryable { log, .. } => {
                log.as_deref().cloned()
            }
            TurnError::Aborted => None,
        }
    }
}

impl From<sqlx::Error> for TurnError {
    fn from(e: sqlx::Error) -> TurnError {
        TurnError::retryable_from("database", e)
    }
}

impl From<EngineError> for TurnError {
    fn from(e: EngineError) -> TurnError {
        match e {
            EngineError::Aborted => TurnError::Aborted,
            e => TurnError::Retryable {
                message: e.to_string(),
                source: Some(Box::new(e)),
                log: None,
            },
        }
    }
}

/// The first 12 hex digits of a SHA-256, as logs, headers and reports show versions.
pub fn short_sha(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

/// A replay's copy of session `source` in run `run` (`kvmem replay`). Memory treats such
/// copies as a re-run, not as the user speaking again.
pub fn replay_session(run: &str, source: &str) -> String {
    format!("replay:{run}:{source}")
}

/// Whether `session_id` is a replay's copy ([`replay_session`]).
pub fn is_replay(session_id: &str) -> bool {
    session_id.starts_with("replay:")
}

/// The session a replay copy was made from; `None` for an ordinary session.
pub fn replay_source(session_id: &str) -> Option<&str> {
    session_id
        .strip_prefix("replay:")?
        .split_once(':')
        .map(|(_, source)| source)
}
