//! The commands a person runs besides the worker itself: the demo, batch replay, the
//! queue status report and the migration status. Each is a library function so tests
//! drive them directly.

pub mod character;
pub mod demo;
mod demo_memory;
mod demo_recall;
pub mod erase;
pub mod keys;
pub mod memory;
pub mod migrations;
pub mod replay;
mod scene;
pub mod status;
pub mod summary;
