//! What a `kvmem memory` command fails with, shown to the user as it is.

use crate::config::ConfigError;
use crate::db::DbError;
use crate::memory::MemoryError;

/// A `kvmem memory` command's error: the memory layer's, the settings', the database's, or
/// the output's.
#[derive(Debug, thiserror::Error)]
pub enum MemoryCliError {
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    System(#[from] crate::system::SystemError),
    #[error("{0}")]
    Output(String),
}

pub type Result<T, E = MemoryCliError> = std::result::Result<T, E>;
