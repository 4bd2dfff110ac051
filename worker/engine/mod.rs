//! llama.cpp behind a safe seam: the model is loaded once per process, each context lives
//! on its own OS thread, and a [`KvSession`] tracks which tokens and segments the KV holds
//! so pruning, ephemeral spans and snapshots stay exact.

pub mod batch;
pub mod device;
mod error;
mod frame;
pub mod generate;
mod model;
pub mod pool;
mod sampling;
mod session;
pub mod threads;

pub use device::{GpuChoice, Placement};
pub use error::{EngineError, Result};
pub use frame::{Block, ChatFrame};
pub use generate::{Busy, GenerateError};
pub use model::{backend, file_sha256, Engine, EngineParams, TokenSink, LLAMA_BUILD};
pub use pool::{Contexts, EnginePool};
pub use sampling::{stop_at, unstoppable_len, Sampling};
pub use session::{GenStats, KvSession};
