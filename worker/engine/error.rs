//! What the engine fails with: model problems at start-up, decode failures in a turn.

use std::path::PathBuf;

/// Engine failures. Model problems are fatal at start-up; decode failures fail one turn.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("model file {path}: {problem}")]
    Model { path: PathBuf, problem: String },
    #[error("model file {path} has SHA-256 {actual}, but MODEL_SHA pins {expected}")]
    ShaMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("the model's chat template cannot frame a turn: {0}")]
    Template(String),
    #[error("llama.cpp context: {0}")]
    Context(String),
    #[error("decode failed: {0}")]
    Decode(String),
    #[error("KV state restore was refused by llama.cpp (other KV type or corrupt state)")]
    RestoreRefused,
    #[error("aborted")]
    Aborted,
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
