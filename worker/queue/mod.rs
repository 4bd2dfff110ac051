//! The turn queue in Postgres: claim with a per-session lease, heartbeat, fenced
//! completion, retry or death, and the reaper; and what the faces (HTTP, commands) read of
//! turns and their log rows. Every statement lives in `sql/queue/`.

mod claim;
mod complete;
mod conversation;
mod enqueue;
mod fail;
mod finish;
mod log;
mod lookup;
mod monitor;
mod reap;
mod replay;
mod types;

pub use crate::turn::{ClaimedTurn, TurnId, TurnState};
pub use claim::{claim, claim_preferring, claim_up_to, heartbeat, lease_held, SessionLease};
pub use complete::{complete, complete_many, Completion};
pub use conversation::{
    enqueue_matched, enqueue_named, Conversation, Found, HistoryLimits, Placed,
};
pub use enqueue::{enqueue, enqueue_on, enqueue_repeatable, NewTurn, Repeat};
pub use fail::{fail, release};
pub use log::{
    last_digest_injected, last_user_tokens, ok_turn_logs, recent_bpt, turn_injected, OkTurnLog,
    TurnInjected,
};
pub use lookup::{
    mark_delivered, owned_turn, session_kv_tokens, session_owner, turn_outcome, turn_state,
    turns_held, OwnedTurn,
};
pub use monitor::{
    dead_turns, latency, oldest_queued, running_turns, state_counts, warm_cold, DeadTurn,
    RunningTurn,
};
pub use reap::{reap, trim_events, Reaped};
pub use replay::{finished_count, replayed_turn, source_turns, LogStart, ReplayedTurn, SourceTurn};
pub use types::{QueueError, QueueTiming, Result};

/// Channel the enqueue function notifies, payload = session id.
pub const TURNS_CHANNEL: &str = "kvmem_turns";
/// Channel announcing finished turns, payload = JSON `{turn_id, session_id, state}`.
pub const TURN_DONE_CHANNEL: &str = "kvmem_turn_done";
