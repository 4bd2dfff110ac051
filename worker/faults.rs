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

use std::sync::OnceLock;

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
