//! The turn queue in Postgres: claim with a per-session lease, heartbeat, fenced
//! completion, retry or death, and the reaper. Every statement lives in `sql/queue/`.

mod claim;
mod complete;
mod conversation;
mod enqueue;
mod fail;
mod finish;
mod reap;
mod types;

pub use crate::turn::{ClaimedTurn, TurnId, TurnState};
pub use claim::{claim, claim_preferring, claim_up_to, heartbeat, last_done, lease_held};
pub use complete::{complete, complete_many, Completion};
pub use conversation::{
    enqueue_matched, enqueue_named, Conversation, Found, HistoryLimits, Placed,
};
pub use enqueue::{enqueue, enqueue_on, enqueue_repeatable, NewTurn, Repeat};
pub use fail::{fail, release};
pub use reap::{reap, trim_events, Reaped};
pub use types::{QueueError, QueueTiming, Result};

/// Channel the enqueue function notifies, payload = session id.
pub const TURNS_CHANNEL: &str = "kvmem_turns";
/// Channel announcing finished turns, payload = JSON `{turn_id, session_id, state}`.
pub const TURN_DONE_CHANNEL: &str = "kvmem_turn_done";
