//! The digest: a session's world-state facts as a short canonical text whose SHA-256 is
//! its version. Same facts, same text, same version, whatever the insert order, process
//! or clock: that is what lets a turn skip re-injecting a digest the KV already holds.

mod rebuild;
mod rebuilder;
mod session;
mod text;

pub use rebuild::{
    build_for, current, rebuild, rebuild_batch, rebuild_due, rebuild_notified, sweep, Pick,
    Rebuilt, Stored, MAX_BATCH,
};
pub use rebuilder::{run_rebuilder, FACTS_CHANNEL};
pub use session::{copy_facts, facts_changed, last_change, seed_fact, start_demo_conflict};
pub use text::{build, canonicalize, relevance, render_line, version_of, Built, Fact, Relevance};
