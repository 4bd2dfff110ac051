//! Replies that stream: a worker publishes each turn's reply as deltas while it generates
//! it, through Postgres (NOTIFY on the turn's and the session's channel, and an unlogged
//! table for readers that arrive late), so a backend can read them with plain SQL and
//! `kvmem serve` can relay them as server-sent events. [`publish`] is the worker's side,
//! [`follow`] a reader's. The channel names, the late reader's function and the payload's
//! SQL side live in `sql/api/stream.sql`.

mod delta;
pub mod follow;
pub mod publish;

pub use delta::{
    pieces, so_far, trim, turn_channel, Delta, Note, SoFar, MAX_DELTA_BYTES, RETENTION_SECS,
};
pub use follow::{Follow, Heard, Hub};
pub use publish::{Publisher, Target, TurnStream};
