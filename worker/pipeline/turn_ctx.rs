//! What steps 2 and 6 (`load.rs`, `save.rs`) need of the pipeline for one turn, handed to
//! them explicitly, so that they are plain functions and do not depend on `TurnPipeline`.

use sqlx::PgPool;

use crate::config::Settings;
use crate::engine::Engine;
use crate::snapshot::SnapshotStore;
use crate::turn::{ClaimedTurn, Lease};

/// One claimed turn and the parts of the pipeline its snapshot is read, checked and
/// written with. Borrowed for the turn only; not to be confused with a llama.cpp context.
pub(super) struct TurnCtx<'a> {
    pub db: &'a PgPool,
    pub store: &'a SnapshotStore,
    pub engine: &'a Engine,
    pub settings: &'a Settings,
    pub turn: &'a ClaimedTurn,
    /// The snapshot's scope key (`snapshot::scope_key`).
    pub scope: &'a str,
    /// The turn's lease, which the save asks before it writes.
    pub lease: &'a Lease,
}
