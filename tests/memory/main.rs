//! Long-term memory on the real embedders (MiniLM, e5): the store, search, import, the
//! embedder's identity and what a character keeps of a user.

#[path = "../common/mod.rs"]
mod common;

mod character_memory;
mod embed_identity;
mod embedder;
mod memory;
mod sessions;
