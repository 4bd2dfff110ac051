//! kvmem gives LLM chat characters durable memory while keeping each turn fast.
//!
//! A backend queues chat turns in PostgreSQL with plain SQL (`kvmem_enqueue_turn`). Workers
//! claim them with `FOR UPDATE SKIP LOCKED` under a per-session lease, so a session's turns
//! run one at a time and in order, and a fencing token keeps a worker that lost its lease
//! from ever writing a reply. The queue lives in Postgres because the turn, its reply, the
//! dialogue and the log row must commit together: one transaction, no second system.
//!
//! Each turn runs a local model through llama.cpp and resumes the session's KV cache from
//! an LLKV1 snapshot instead of re-reading the history. Around the KV sit the HUD (the
//! character's self-state, ephemeral) and the digest (world-state facts, versioned by
//! SHA-256 and injected only when it changed).
//!
//! The modules, from the bottom up (a module uses only those below it; CONTRIBUTING.md
//! draws the picture): foundations ([`config`], [`db`], [`metrics`], [`telemetry`],
//! [`faults`]); [`snapshot`] and [`engine`]; [`turn`]; [`queue`], [`context`] and [`stream`];
//! [`memory`], [`summary`], [`erase`], [`keys`] and [`characters`]; [`pipeline`]; [`runner`]; [`system`]; [`http`] and [`cmd`].

pub mod characters;
pub mod cmd;
pub mod config;
pub mod context;
pub mod db;
pub mod engine;
pub mod erase;
pub mod faults;
pub mod http;
pub mod keys;
pub mod lane;
pub mod maintenance;
pub mod memory;
pub mod metrics;
pub mod pipeline;
pub mod queue;
pub mod runner;
pub mod services;
pub mod snapshot;
pub mod stream;
pub mod summary;
pub mod system;
pub mod telemetry;
pub mod turn;

#[cfg(test)]
mod config_reference;
