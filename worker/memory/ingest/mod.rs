//! The ingest room: what turns messages into memories. The model-backed extraction with
//! its grammar and screens, and the thread that runs the extraction model.

pub mod backfill;
pub mod extract;
pub mod import;
pub mod jobs;
pub mod llm;
