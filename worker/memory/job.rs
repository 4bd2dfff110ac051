//! Two rooms run the memory lane's jobs (ingest's remember and forget, notes' memory
//! lines) and read a job's text the same way; the rule lives here, below both, because
//! ingest already imports notes and notes may not import ingest back.

use super::error::{MemoryError, Result};

/// The text a remember, forget or memory-line job carries; a job without one is invalid.
pub fn job_text<'a>(payload: &'a serde_json::Value, job: &str) -> Result<&'a str> {
    payload["text"]
        .as_str()
        .ok_or_else(|| MemoryError::Invalid(format!("{job} job without text")))
}
