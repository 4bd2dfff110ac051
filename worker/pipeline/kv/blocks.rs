//! The blocks a turn decodes around the KV (base prompt, HUD, user block, reply close) and
//! the optional ones it injects (digest, context, recall), tokenized, chosen and trimmed
//! to fit N_CTX.

use llama_cpp_2::token::LlamaToken;

use crate::engine::{Engine, KvSession};
use crate::snapshot::SegKind;
use crate::turn::TurnError;

use super::job::{LoadedKv, TurnJob};

/// The turn's fixed blocks, tokenized once.
pub(super) struct Blocks {
    pub(super) base: Vec<LlamaToken>,
    /// The HUD segment: the HUD block, then the opening of the next user block (a role
    /// header, the same on every turn), so a warm turn whose HUD has not changed decodes
    /// only its message.
    pub(super) hud: Vec<LlamaToken>,
    /// The user block: `opener` tokens, the message, the block's close.
    pub(super) user: Vec<LlamaToken>,
    pub(super) opener: usize,
    /// The worker-written start of the reply (empty for an ordinary turn).
    pub(super) prefix: Vec<LlamaToken>,
    pub(super) close: Vec<LlamaToken>,
}

/// The optional blocks a turn injects before the HUD, in the order they are trimmed when
/// the turn does not fit N_CTX: recall first, then context, then digest.
#[derive(Default)]
pub(super) struct Injected {
    pub(super) digest: Option<Vec<LlamaToken>>,
    /// The context block's tokens and the version its segment is tagged with.
    pub(super) context: Option<(Vec<LlamaToken>, String)>,
    pub(super) recall: Option<RecallBlock>,
}

impl Injected {
    pub(super) fn any(&self) -> bool {
        self.digest.is_some() || self.context.is_some() || self.recall.is_some()
    }

    pub(super) fn context_len(&self) -> u32 {
        self.context.as_ref().map_or(0, |(c, _)| c.len() as u32)
    }
}

/// A recall block's tokens and the item keys it carries.
pub(super) type RecallBlock = (Vec<LlamaToken>, Vec<String>);

impl Blocks {
    pub(super) fn new(engine: &Engine, job: &TurnJob) -> Blocks {
        // `block` tokenizes the frame's parts apart from the content, so the user block
        // always starts with exactly these tokens.
        let opener = engine.tokenize_special(&engine.frame.user.parts[0], false);
        Blocks {
            base: engine.base_tokens(&job.base_prompt),
            hud: [
                engine.block(&engine.frame.system, &[&job.hud]),
                opener.clone(),
            ]
            .concat(),
            user: engine.block(&engine.frame.user, &[&job.user]),
            opener: opener.len(),
            prefix: if job.reply_prefix.is_empty() {
                Vec::new()
            } else {
                engine.tokenize_plain(&job.reply_prefix)
            },
            close: engine.tokenize_special(&engine.frame.reply_close, false),
        }
    }
}

/// The digest block to inject this turn, if one is due.
pub(super) fn digest_block(
    engine: &Engine,
    job: &TurnJob,
    session: &KvSession,
    loaded: &LoadedKv,
) -> Option<Vec<LlamaToken>> {
    let has_digest = session.segments().iter().any(|s| s.kind == SegKind::Digest);
    let due = match &loaded.seen_digest {
        // An emptied digest is injected once, so the KV stops believing the old one.
        Some(seen) if job.digest.content.is_empty() => {
            *seen != job.digest.version && !seen.is_empty()
        }
        Some(seen) => *seen != job.digest.version || !has_digest,
        None => !job.digest.content.is_empty(),
    };
    due.then(|| {
        let content = if job.digest.content.is_empty() {
            "(nothing notable)"
        } else {
            &job.digest.content
        };
        engine.block(&engine.frame.system, &[&format!("World state:\n{content}")])
    })
}

/// The context block to inject this turn, if the KV does not hold its version.
pub(super) fn context_block(
    engine: &Engine,
    job: &TurnJob,
    session: &KvSession,
) -> Option<(Vec<LlamaToken>, String)> {
    let newest = session
        .segments()
        .iter()
        .rev()
        .find(|s| s.kind == SegKind::Context);
    if job.context.content.is_empty() {
        // What the KV holds is no longer supported by the stored parts (a todo was closed,
        // a summary withdrawn): an explicit empty block supersedes it, as a newer block
        // supersedes an older one, instead of leaving it standing.
        let stale = newest.is_some_and(|s| s.tag != CLEARED_CONTEXT);
        return stale.then(|| {
            let text = "What you remember now: nothing to note.";
            (
                engine.block(&engine.frame.system, &[text]),
                CLEARED_CONTEXT.to_string(),
            )
        });
    }
    let seen = newest.is_some_and(|s| s.tag == job.context.version);
    (!seen).then(|| {
        let text = format!("What you remember:\n{}", job.context.content);
        (
            engine.block(&engine.frame.system, &[&text]),
            job.context.version.clone(),
        )
    })
}

/// The tag of the block that clears a context the stored parts no longer support.
pub const CLEARED_CONTEXT: &str = "cleared";

/// The recall block: the candidates the KV does not hold, in rank order, as many as fit
/// `recall_max` tokens; and how many candidates the KV already held.
pub(super) fn recall_block(
    engine: &Engine,
    job: &TurnJob,
    session: &KvSession,
) -> (Option<RecallBlock>, u32) {
    let held: std::collections::HashSet<&str> =
        session.segments().iter().flat_map(|s| s.items()).collect();
    let mut in_kv = 0;
    let mut lines: Vec<&str> = Vec::new();
    let mut keys: Vec<String> = Vec::new();
    let mut tokens: Option<Vec<LlamaToken>> = None;
    for item in &job.recall {
        if held.contains(item.key.as_str()) {
            in_kv += 1;
            continue;
        }
        lines.push(&item.text);
        let block = recall_text(engine, &lines);
        if block.len() as u32 > job.recall_max {
            lines.pop();
            continue;
        }
        keys.push(item.key.clone());
        tokens = Some(block);
    }
    (tokens.map(|t| (t, keys)), in_kv)
}

/// Seed 001's relevant-memories block (cards come first in `lines`).
fn recall_text(engine: &Engine, lines: &[&str]) -> Vec<LlamaToken> {
    let body: Vec<String> = lines.iter().map(|l| format!("- {l}")).collect();
    engine.block(
        &engine.frame.system,
        &[&format!("Relevant memories:\n{}", body.join("\n"))],
    )
}

/// Tokens the turn needs besides the KV. When even an empty KV leaves too little room, the
/// optional blocks are trimmed in order (recall, then context, then digest); a message that
/// cannot fit without them is fatal. Returns the tokens needed and the room kept for recall
/// (0 when recall was trimmed).
pub(super) fn budget(
    engine: &Engine,
    job: &TurnJob,
    blocks: &Blocks,
    hud_in_kv: bool,
    injected: &mut Injected,
    recall_room: u32,
) -> Result<(u32, u32), TurnError> {
    let n_ctx = engine.params.n_ctx;
    // The HUD segment ends with the user block's opening.
    let hud = if hud_in_kv { 0 } else { blocks.hud.len() };
    let message = blocks.user.len() - blocks.opener;
    let fixed = (hud + message + blocks.prefix.len() + blocks.close.len()) as u32 + job.reply_max;
    let len = |b: &Option<Vec<LlamaToken>>| b.as_ref().map_or(0, Vec::len) as u32;
    // The base prompt and a kept HUD are in the KV, but no prune can take them out.
    let base = (blocks.base.len() + blocks.hud.len() - hud) as u32;
    let mut recall = recall_room;
    let total =
        |i: &Injected, recall: u32| base + fixed + len(&i.digest) + i.context_len() + recall;
    if total(injected, recall) > n_ctx {
        recall = 0;
    }
    if total(injected, recall) > n_ctx {
        injected.context = None;
    }
    if total(injected, recall) > n_ctx {
        injected.digest = None;
    }
    if total(injected, recall) > n_ctx {
        return Err(TurnError::fatal(format!(
            "message does not fit the context: base {} + HUD {} + message {} + reply {} tokens > N_CTX {}",
            blocks.base.len(),
            blocks.hud.len() - blocks.opener,
            blocks.user.len() + blocks.prefix.len(),
            job.reply_max,
            n_ctx
        )));
    }
    Ok((
        fixed + len(&injected.digest) + injected.context_len() + recall,
        recall,
    ))
}
