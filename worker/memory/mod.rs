//! Long-term memory exists because a character forgets everything that has left the KV
//! tail: typed facts with history, the searchable dialogue and their retrieval live in
//! Postgres next to the queue, so a backend can read them with SQL and a worker can write
//! them on the memory lane without ever blocking a turn.
//!
//! Rooms: [`store`] (facts, keys, history, archiving, entity refs and aliases, the
//! screens every stored fact passes), [`search`] (retrieval: the candidate legs, fusion
//! and ranking, time parsing, entity cards), [`ingest`] (extraction with its grammar, its
//! model thread, bulk import), `ingest::jobs` (the memory lane), [`notes`] (the character's own:
//! remember this about X, memory lines, the explicit-facts blob), `notes::todos` (seed 001's
//! persona-scoped open loops), [`embed`] (MiniLM on llama.cpp, shared by store, search and
//! ingest), [`columns`] (which columns hold a message's vectors, by the embedder's
//! width) and [`render`] (journal and MEMORY.md, for both faces). The faces themselves
//! are `cmd::memory` and `http::memory_api`.
//!
//! What the rooms share sits in files of its own below them, so that no room imports this
//! file: `service` (the [`MemoryService`] search, ingest and notes run on, and its
//! [`MemoryConfig`]),
//! `error` ([`MemoryError`]), `ranker` ([`RankerKind`]), `extractor` (the [`Extractor`]
//! seam), `events` (failures recorded rather than returned) and `job` (what a lane job
//! carries); `queued` holds the jobs `cmd::memory` queues through the SQL API. This file
//! only declares the rooms and names the layer's public types.

pub mod columns;
pub mod embed;
mod error;
mod events;
mod extractor;
pub mod ingest;
mod job;
pub mod notes;
mod queued;
mod ranker;
pub mod render;
pub mod search;
mod service;
pub mod store;

pub use embed::Embedder;
pub use error::{MemoryError, Result};
pub use events::event;
pub use extractor::{ExtractError, ExtractedFact, Extractor};
pub use job::job_text;
pub use queued::{extraction_waiting, queue_forget, queue_remember};
pub use ranker::RankerKind;
pub use service::{MemoryConfig, MemoryService};
