//! What the memory layer fails with, in a file of its own because every room (store,
//! search, ingest, notes, render) returns it and the service's settings parse into it.

use super::embed;

/// Errors of the memory layer. Embedder failures are not here on purpose: they degrade
/// to lexical retrieval and are recorded as events instead of failing the caller.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("embedder: {0}")]
    Embed(#[from] embed::EmbedError),
    #[error("extractor: {0}")]
    Extract(String),
}

pub type Result<T, E = MemoryError> = std::result::Result<T, E>;
