//! Step 5's engine half: after the reply, the hidden memory line comes off and the
//! exchange settles into the KV as a cold start would decode it, ready for the save.

use std::time::Instant;

use llama_cpp_2::token::LlamaToken;

use crate::engine::{Engine, GenStats, KvSession};
use crate::pipeline::reply_stream::reply_split;
use crate::snapshot::SegKind;
use crate::turn::log::FinishReason;
use crate::turn::TurnError;

use super::blocks::Blocks;
use super::job::{KvOutcome, Prompt, TurnRun};
use super::prepared::Prepared;

/// Step 5's engine half after the reply: the hidden memory line comes off, the exchange
/// settles into the KV, and the state is exported for the save.
pub(super) fn finish(
    engine: &Engine,
    session: &mut KvSession,
    prepared: Prepared,
    generated: Vec<LlamaToken>,
    prompt: Prompt,
    mut stats: GenStats,
) -> Result<KvOutcome, TurnError> {
    let Prepared {
        job,
        blocks,
        loaded,
        injected,
        tokens_loaded,
        load_ms,
        hud_kept,
        hud_start,
        recall_in_kv,
        ..
    } = prepared;
    // Both generation loops (alone and batched) stop at `reply_max` tokens, at an
    // end-of-generation token, which is never kept, or once the reply holds a stop string,
    // which is cut off with what follows it: a full budget without a stop string is a
    // cut-off reply.
    let reply = [&blocks.prefix[..], &generated[..]].concat();
    let (hidden, stopped) = reply_split(engine, &reply, blocks.prefix.len(), &job.sampling.stop);
    let finish = if !stopped && generated.len() as u32 >= job.reply_max {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    // A hidden memory-line tail or a stop string leaves the reply, and the KV keeps the
    // reply as stored (the same text the stream's last delta completed): the settle below
    // decodes the exchange again from these tokens.
    let stored = if hidden.stripped || stopped {
        engine.tokenize_plain(&hidden.reply)
    } else {
        reply.clone()
    };

    // 5. The exchange stays, within the tail, and the current HUD goes back to the end.
    let redecode_started = Instant::now();
    settle(session, hud_start, &blocks, &stored, job.tail, job.turn_id)?;
    stats.redecode_ms = redecode_started.elapsed().as_millis() as u64;

    let state = job.export.then(|| session.export_state());
    let c_tokens = injected.context_len();
    let digest = injected.digest;
    let digest_injected = digest.is_some();
    Ok(KvOutcome::Ran(Box::new(TurnRun {
        reply: hidden.reply,
        memory_line: hidden.line,
        token_ids: session.token_ids(),
        segments: session.segments().to_vec(),
        state,
        warm: loaded.rebuild.is_none(),
        rebuild: loaded.rebuild,
        tokens_loaded,
        digest_injected,
        kv_digest_version: if digest_injected {
            job.digest.version.clone()
        } else {
            loaded.seen_digest.unwrap_or_default()
        },
        s_tokens: digest.as_ref().map_or(0, |d| d.len() as u32),
        u_tokens: engine.count_tokens(&job.user) as u32,
        r_tokens: reply.len() as u32,
        finish,
        c_tokens,
        context_injected: injected.context.is_some(),
        m_tokens: injected.recall.as_ref().map_or(0, |(t, _)| t.len() as u32),
        recalled: injected.recall.map(|(_, keys)| keys).unwrap_or_default(),
        recall_in_kv,
        load_ms,
        prefill_tokens: prompt.prefill_tokens,
        prompt_tokens: prompt.prompt_tokens,
        hud_kept,
        stats,
    })))
}

/// Step 5's KV half. Everything from the HUD on leaves the KV and is decoded again
/// without the HUD in front of the message: the blocks injected this turn, the exchange
/// (message, reply, close) as one segment, then the HUD segment (the current HUD and the
/// next user block's opening) as the last segment, where the next turn finds it. A prune
/// comes first when the tail needs one. The saved KV is then exactly what a cold start
/// decodes from the same tokens ([`history::decode_exact`]), and it never holds more than
/// one HUD. `reply` is the reply as stored (without a memory-line tail), so the KV never
/// holds the tail.
///
/// [`history::decode_exact`]: crate::pipeline::history::decode_exact
pub(super) fn settle(
    session: &mut KvSession,
    hud_start: u32,
    blocks: &Blocks,
    reply: &[LlamaToken],
    tail: u32,
    turn_id: i64,
) -> Result<(), TurnError> {
    // The segments after the HUD: this turn's injected blocks, then the exchange so far.
    let mut injected = Vec::new();
    let mut at = 0usize;
    for seg in session.segments() {
        let span = at..at + seg.len as usize;
        at = span.end;
        if span.start > hud_start as usize {
            injected.push((seg.clone(), session.tokens()[span].to_vec()));
        }
    }
    injected.pop();
    let exchange = [&blocks.user[..], reply, &blocks.close[..]].concat();
    session.truncate_tail(hud_start)?;
    let room = (injected.iter().map(|(_, t)| t.len()).sum::<usize>()
        + exchange.len()
        + blocks.hud.len()) as u32;
    if session.len() + room > tail {
        session.prune_to(low_water(tail).saturating_sub(room))?;
    }
    for (seg, tokens) in &injected {
        session.append_segment(tokens, seg.kind, &seg.tag)?;
    }
    session.append_segment(&exchange, SegKind::Turn, &turn_id.to_string())?;
    session.append(&blocks.hud, Some(SegKind::Hud))?;
    // Only an exchange longer than the tail itself still overflows: it goes too.
    session.prune_to(tail)?;
    Ok(())
}

/// Where a prune at the end of a turn takes the KV: below the tail, so the re-decode a
/// prune costs comes once every few turns instead of on every turn at the plateau.
fn low_water(tail: u32) -> u32 {
    tail - tail / 4
}
