//! A turn after steps 1–3, up to its message: what the generate and settle steps take
//! from the prepare step.

use std::time::Instant;

use llama_cpp_2::token::LlamaToken;

use super::blocks::{Blocks, Injected};
use super::job::{LoadedKv, Prompt, TurnJob};
use crate::engine::{Engine, KvSession};
use crate::pipeline::reply_stream::ReplyStream;
use crate::stream;

/// How a turn's KV came up.
pub(super) enum Opened<'e, 'c> {
    Ready(KvSession<'e, 'c>, Box<Prepared>),
    /// The snapshot could not be restored: why.
    Refused(String),
}

/// A turn after steps 1–3, up to its message.
pub(super) struct Prepared {
    pub(super) job: TurnJob,
    pub(super) blocks: Blocks,
    pub(super) loaded: LoadedKv,
    pub(super) injected: Injected,
    pub(super) tokens_loaded: u32,
    pub(super) load_ms: u64,
    pub(super) prefill_started: Instant,
    pub(super) hud_kept: bool,
    /// Where the HUD segment starts, for step 5.
    pub(super) hud_start: u32,
    pub(super) recall_in_kv: u32,
}

impl Prepared {
    /// The reply's stream, opened with what the turn knows as it starts generating: the
    /// first delta's `meta`, which the HTTP relay's first chunk carries.
    pub(super) fn open_stream(&self, engine: &Engine, prompt: Prompt) -> ReplyStream {
        let mut reply = ReplyStream::new(
            engine,
            self.job.stream.as_ref().map(stream::Target::open),
            &self.blocks.prefix,
            &self.job.sampling.stop,
        );
        reply.start(
            engine,
            serde_json::json!({
                "cold": self.loaded.rebuild.is_some(),
                "digest_injected": self.injected.digest.is_some(),
                "digest_version": self.job.digest.version,
                "prompt_tokens": prompt.prompt_tokens,
                "cached_tokens": prompt.prompt_tokens.saturating_sub(prompt.prefill_tokens),
            }),
        );
        reply
    }

    /// The tokens that open the exchange (a new turn segment): the whole user block after
    /// injected blocks, else the message after the HUD segment's opening.
    pub(super) fn message(&self) -> &[LlamaToken] {
        if self.injected.any() {
            &self.blocks.user
        } else {
            &self.blocks.user[self.blocks.opener..]
        }
    }
}
