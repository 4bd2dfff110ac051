//! Why a system could not be started: one error for the builder and everything it loads,
//! which the commands report as it reads.

use crate::engine::EngineError;

/// Why a system could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error("KVMEM_MODEL_PATH is not set (run ops/fetch-model for SmolLM2)")]
    NoModel,
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("model loading stopped: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("settings: {0}")]
    Settings(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A server's start gave up because shutdown was asked before the database answered.
    #[error("stopped before the database was reachable")]
    Stopped,
}
