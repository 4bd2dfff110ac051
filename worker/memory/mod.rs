//! Long-term memory.

pub mod extract;
pub mod filters;
