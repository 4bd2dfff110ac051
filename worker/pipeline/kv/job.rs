//! What goes into the engine thread for a turn and what comes out: the job, where its KV
//! starts from, how step 1 went, the prompt the reply was conditioned on, and the run.

use crate::context::digest;
use crate::engine::{GenStats, Sampling};
use crate::pipeline::history;
use crate::pipeline::recall::{ContextBlock, RecallItem};
use crate::snapshot::{self, Snapshot};
use crate::stream;
use crate::turn::log::{FinishReason, Rebuild};
use crate::turn::KvRecord;

/// What the engine thread needs for one turn, besides where its KV comes from.
#[derive(Clone)]
pub struct TurnJob {
    /// Tags the turn's exchange segment, so the segment table says which turns the KV holds.
    pub turn_id: i64,
    pub base_prompt: String,
    pub hud: String,
    pub digest: digest::Stored,
    /// The context block; injected when the KV has not seen this version.
    pub context: ContextBlock,
    /// Recall candidates in rank order (cards first); only those the KV lacks go in.
    pub recall: Vec<RecallItem>,
    /// MEMORY_MAX_TOKENS: the recall block's whole size.
    pub recall_max: u32,
    pub user: String,
    /// The start of the reply, written by the worker (an in-chat command's answer); the
    /// model continues from it. Empty for an ordinary turn.
    pub reply_prefix: String,
    pub tail: u32,
    /// The reply's token budget: the request's `max_tokens`, within REPLY_MAX_TOKENS.
    pub reply_max: u32,
    /// The reply's own sampling and stop strings (the request's, over the configured).
    pub sampling: Sampling,
    pub export: bool,
    /// Where the reply streams while it is generated; `None`: it is not streamed.
    pub stream: Option<stream::Target>,
}

/// Where the turn's KV comes from.
pub enum Start {
    /// A trusted snapshot: resume warm.
    Snapshot(Box<Snapshot>),
    /// No trusted snapshot: rebuild the dialogue into an empty KV.
    Cold(ColdSource),
}

/// What a cold start lays back into the KV.
pub enum ColdSource {
    /// The token ids and segments the KV held after the last committed turn: the warm
    /// KV's dialogue, token for token.
    Exact(KvRecord),
    /// The recent exchanges' text, oldest first, re-tokenized (empty on a first turn).
    Text(Vec<history::Exchange>),
}

/// How the engine thread's part ended.
#[derive(Debug)]
pub enum KvOutcome {
    Ran(Box<TurnRun>),
    /// The snapshot could not be restored into this context (base prompt changed, or
    /// llama.cpp refused the state): the pipeline starts the turn again, cold.
    Refused(String),
}

/// What the engine thread produced.
#[derive(Debug)]
pub struct TurnRun {
    pub reply: String,
    /// The line the reply's hidden tail asked to keep (already cut off `reply`).
    pub memory_line: Option<String>,
    pub token_ids: Vec<i32>,
    pub segments: Vec<snapshot::Segment>,
    pub state: Option<Vec<u8>>,
    pub warm: bool,
    /// How a cold start rebuilt the dialogue; `None` when warm.
    pub rebuild: Option<Rebuild>,
    pub tokens_loaded: u32,
    pub digest_injected: bool,
    /// The digest version the saved KV has seen ("" if none).
    pub kv_digest_version: String,
    pub s_tokens: u32,
    pub u_tokens: u32,
    pub r_tokens: u32,
    /// Whether the model ended the reply (or a stop string did) or `reply_max` cut it off.
    pub finish: FinishReason,
    /// The context block, when injected: its tokens.
    pub c_tokens: u32,
    pub context_injected: bool,
    /// The recall block, when injected: its tokens and the items it carried.
    pub m_tokens: u32,
    pub recalled: Vec<String>,
    /// Candidates left out because the KV already holds them.
    pub recall_in_kv: u32,
    pub load_ms: u64,
    /// Prompt tokens decoded before the first reply token (a cold start's lay-back, a
    /// prune's re-decode, injected blocks, a changed HUD, the message).
    pub prefill_tokens: u32,
    /// The whole prompt the reply was conditioned on: what the KV held when generation
    /// started, restored or decoded.
    pub prompt_tokens: u32,
    /// The HUD the KV ended with was the current one, so it was not decoded again.
    pub hud_kept: bool,
    pub stats: GenStats,
}

/// How step 1 went.
pub(super) struct LoadedKv {
    /// `None` when warm.
    pub(super) rebuild: Option<Rebuild>,
    /// The digest version the KV has seen, when its dialogue is known exactly (warm, or
    /// rebuilt from the record); `None` after a text rebuild, which holds no digest.
    pub(super) seen_digest: Option<String>,
}

/// The prompt a reply was conditioned on: what the KV held when generation started, and
/// how much of it this turn decoded.
#[derive(Debug, Clone, Copy)]
pub(super) struct Prompt {
    pub(super) prefill_tokens: u32,
    pub(super) prompt_tokens: u32,
}
