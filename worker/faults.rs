//! Test hooks, labelled as such: with `KVMEM_TEST_STOP_AT=<point>` a worker stops itself
//! (SIGSTOP) when a turn reaches that point, so reliability tests pause or kill it at an
//! exact step (mid snapshot write, after the save but before the commit) instead of
//! guessing with timers. Unset, as in production, every call is one relaxed load.
//!
//! `KVMEM_TEST_PANIC_AT=fetch_loop` panics the worker's fetch loop, to prove that a worker
//! whose task died stops its process instead of lingering.
//!
//! Points: `before_save` (generation done, snapshot not yet written), `mid_write` (half
//! the snapshot bytes in the temp file), `before_rename` (temp file complete and synced),
//! `after_save` (renamed into place, completion not yet committed), `mid_stream` (the first
//! delta with reply text published; the reply is half streamed; stops once per process).
//!
//! `KVMEM_TEST_HTTP_FAULTS=500@queued,502@done` makes the chat endpoint answer a request
//! that reaches a point with that status instead, each entry once and in order, so the
//! retry tests can fail a request after its turn was queued ([`HttpFaults`]).

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};

fn configured() -> Option<&'static str> {
    static POINT: OnceLock<Option<String>> = OnceLock::new();
    POINT
        .get_or_init(|| std::env::var("KVMEM_TEST_STOP_AT").ok())
        .as_deref()
}

/// Panics if the test hook `KVMEM_TEST_PANIC_AT` names `point`.
pub fn panic_point(point: &str) {
    static POINT: OnceLock<Option<String>> = OnceLock::new();
    let configured = POINT.get_or_init(|| std::env::var("KVMEM_TEST_PANIC_AT").ok());
    if configured.as_deref() == Some(point) {
        panic!("KVMEM_TEST_PANIC_AT={point}: panicking for a test");
    }
}

/// Stops the whole process if the test hook names `point`; returns when it is continued.
pub fn stop_point(point: &str) {
    if configured() == Some(point) {
        tracing::warn!(point, "KVMEM_TEST_STOP_AT: stopping (SIGSTOP) for a test");
        // SAFETY: raise() with a valid signal number has no memory-safety preconditions.
        unsafe {
            libc::raise(libc::SIGSTOP);
        }
    }
}

/// Whether the test hook `KVMEM_TEST_STOP_AT` names `point` (for a point that must stop
/// the process only once).
pub fn stops_at(point: &str) -> bool {
    configured() == Some(point)
}

/// The chat endpoint's scripted failures: `status@point` entries, taken in order, each by
/// the first request that reaches its point while it is the next entry. Points: `queued`
/// (the turn was just queued), `done` (the turn ended; its answer not yet sent), `started`
/// (a streamed reply's first chunk is ready; nothing sent yet). Empty unless
/// `KVMEM_TEST_HTTP_FAULTS` (or a test) sets it.
#[derive(Debug, Default)]
pub struct HttpFaults {
    script: Mutex<VecDeque<(u16, String)>>,
}

/// What is wrong with a `KVMEM_TEST_HTTP_FAULTS` script; the test that wrote it reads
/// this in the panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultSpecError {
    #[error("{entry:?} is not status@point")]
    NotStatusAtPoint { entry: String },
    #[error("{status:?} is not an HTTP error status")]
    NotErrorStatus { status: String },
    #[error("unknown point {point:?} (queued, done, started)")]
    UnknownPoint { point: String },
}

impl HttpFaults {
    /// The script in `KVMEM_TEST_HTTP_FAULTS`; none when unset. A malformed one is a bug in
    /// the test that set it, so it panics with what is wrong.
    pub fn from_env() -> HttpFaults {
        match std::env::var("KVMEM_TEST_HTTP_FAULTS") {
            Ok(spec) => HttpFaults::parse(&spec)
                .unwrap_or_else(|e| panic!("KVMEM_TEST_HTTP_FAULTS={spec}: {e}")),
            Err(_) => HttpFaults::default(),
        }
    }

    /// Parses `500@queued,502@done`.
    pub fn parse(spec: &str) -> Result<HttpFaults, FaultSpecError> {
        let mut script = VecDeque::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let not_status_at_point = || FaultSpecError::NotStatusAtPoint {
                entry: entry.to_string(),
            };
            let (status, point) = entry.split_once('@').ok_or_else(not_status_at_point)?;
            let status: u16 = status
                .parse()
                .ok()
                .filter(|s| (400..600).contains(s))
                .ok_or_else(|| FaultSpecError::NotErrorStatus {
                    status: status.to_string(),
                })?;
            if !matches!(point, "queued" | "done" | "started") {
                return Err(FaultSpecError::UnknownPoint {
                    point: point.to_string(),
                });
            }
            script.push_back((status, point.to_string()));
        }
        Ok(HttpFaults {
            script: Mutex::new(script),
        })
    }

    /// The status to answer with at `point`, if the next entry is for it (and takes it).
    pub fn take(&self, point: &str) -> Option<u16> {
        let mut script = self.script.lock().unwrap_or_else(|p| p.into_inner());
        if script.front().is_some_and(|(_, p)| p == point) {
            return script.pop_front().map(|(status, _)| status);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::HttpFaults;

    #[test]
    fn http_faults_are_taken_in_order_at_their_points() {
        let f = HttpFaults::parse("500@queued, 502@done").unwrap();
        assert_eq!(f.take("done"), None, "the next entry is for `queued`");
        assert_eq!(f.take("queued"), Some(500));
        assert_eq!(f.take("queued"), None);
        assert_eq!(f.take("done"), Some(502));
        assert_eq!(f.take("done"), None);
        let err = |spec: &str| HttpFaults::parse(spec).unwrap_err().to_string();
        assert_eq!(err("500"), r#""500" is not status@point"#);
        assert_eq!(err("200@queued"), r#""200" is not an HTTP error status"#);
        assert_eq!(
            err("500@nowhere"),
            r#"unknown point "nowhere" (queued, done, started)"#
        );
    }
}
