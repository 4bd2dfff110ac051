//! Turns, KV snapshots, digests, batching, streaming, extraction and summaries on real
//! models: SmolLM2 where the text matters, the tiny random model for mechanics.

#[path = "../common/mod.rs"]
mod common;

mod batch;
mod characters;
mod cold_warm;
mod digest;
mod engine;
mod erase;
mod erase_parts;
mod extract;
mod fencing;
mod frontend;
// llama.cpp's Vulkan backend on lavapipe: built and run by ops/test-gpu only.
#[cfg(feature = "vulkan")]
mod gpu;
mod process;
mod retry;
mod sampling;
mod summary;
