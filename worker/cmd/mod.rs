//! The commands of the `kvmem` binary, each a library function (so tests drive them
//! directly) that `main.rs` only dispatches to: the worker, serve, the demo, batch replay,
//! the queue commands and reports, memory, summaries, erase, characters and keys.

pub mod character;
pub mod demo;
mod demo_memory;
mod demo_recall;
pub mod erase;
pub mod error;
pub mod keys;
pub mod memory;
pub mod migrations;
pub mod queue;
pub mod replay;
pub mod replay_cli;
mod scene;
pub mod serve;
pub mod status;
pub mod summary;
pub mod worker;
