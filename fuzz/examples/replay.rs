//! Runs decode (with both fuzz limits) on files outside the fuzzer, in a plain build (no
//! sanitizer, no coverage): what a crash or timeout input does, and how long it takes.
//!   cargo run --release --manifest-path fuzz/Cargo.toml --example replay -- FILE...
use std::time::Instant;

fn main() {
    for path in std::env::args().skip(1) {
        let file = std::fs::read(&path).expect("read");
        for limits in kvmem_fuzz::LIMITS {
            let t = Instant::now();
            let result = kvmem_fuzz::snapshot::decode(&file, limits);
            let took = t.elapsed();
            let what = match result {
                Ok(s) => format!(
                    "ok: {} tokens, {} state bytes",
                    s.token_ids.len(),
                    s.state.len()
                ),
                Err(e) => format!("error: {e}"),
            };
            println!(
                "{path}: max_state_bytes={}: {what} ({took:.2?})",
                limits.max_state_bytes
            );
        }
    }
}
