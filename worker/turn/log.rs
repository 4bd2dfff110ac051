//! Seed 000's one-line turn log, kept byte-exact for the tools that grep it, and the
//! `turn_log` row that carries the same fields plus timings.

use std::fmt;

use chrono::{DateTime, Utc};

use super::claimed::ClaimedTurn;

/// Which pipeline produced the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnPath {
    /// Warm resume from KV snapshots (`KV_ONLY_ENABLED=true`).
    KvOnly,
    /// The rollback path: every turn re-reads the dialogue (`KV_ONLY_ENABLED=false`).
    Rollback,
    /// The echo generator, for queue tests and benchmarks only.
    Echo,
}

impl TurnPath {
    pub fn as_str(self) -> &'static str {
        match self {
            TurnPath::KvOnly => "kv_only",
            TurnPath::Rollback => "rollback",
            TurnPath::Echo => "echo",
        }
    }
}

/// How a cold start laid the dialogue back into the KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebuild {
    /// The recorded token ids and segments of the last committed turn: the warm KV's dialogue.
    Exact,
    /// The dialogue text re-tokenized from `messages` (another model, no record, or rollback).
    Text,
}

impl Rebuild {
    pub fn as_str(self) -> &'static str {
        match self {
            Rebuild::Exact => "exact",
            Rebuild::Text => "text",
        }
    }
}

/// Why generation stopped, as OpenAI's `finish_reason` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended its reply (an end-of-generation token).
    Stop,
    /// `REPLY_MAX_TOKENS` cut the reply off.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Every field of the seed's log line, plus what the `turn_log` row adds.
#[derive(Debug, Clone)]
pub struct KvLog {
    pub path: TurnPath,
    pub sid: String,
    pub loaded: bool,
    pub cold: bool,
    pub cold_reason: Option<String>,
    /// How a cold start rebuilt the dialogue (`None` when warm).
    pub rebuild: Option<Rebuild>,
    pub tokens_loaded: u32,
    /// Tokens in the KV after the save: the invariant `tokens_in_kv <= KV_TAIL_TOKENS` is on this.
    pub tokens_in_kv: u32,
    pub kv_bytes: u64,
    pub n_ctx: u32,
    pub digest_injected: bool,
    pub digest_version: String,
    /// S: digest tokens injected this turn.
    pub s_tokens: u32,
    /// U: user message tokens.
    pub u_tokens: u32,
    /// R: reply tokens.
    pub r_tokens: u32,
    /// Why generation stopped; `None` when the attempt did not generate (it failed).
    pub finish_reason: Option<FinishReason>,
    /// Bytes per token of the saved state.
    pub bpt: u32,
    /// M: recall tokens injected this turn, and the items they carried.
    pub m_tokens: u32,
    pub memories_injected: u32,
    pub memory_keys: Vec<String>,
    /// Recall candidates left out because the KV already held them.
    pub recall_in_kv: u32,
    /// Time to gather the recall candidates (query embedding and search).
    pub recall_ms: u64,
    /// The context block: injected this turn, its tokens and the current version.
    pub context_injected: bool,
    pub c_tokens: u32,
    pub context_version: String,
    pub status: &'static str,
    pub error: Option<String>,
    pub latency_ms: u64,
    pub load_ms: u64,
    pub prefill_ms: u64,
    /// Prompt tokens decoded before the first reply token.
    pub prefill_tokens: u32,
    /// The whole prompt the reply was conditioned on: the KV when generation started
    /// (restored from the snapshot, or decoded this turn). OpenAI's `usage.prompt_tokens`.
    pub prompt_tokens: u32,
    /// The KV ended with the current HUD, which was therefore not decoded again.
    pub hud_kept: bool,
    /// Where a warm turn's snapshot came from (local, cache, remote); `None` when cold.
    pub kv_source: Option<&'static str>,
    pub ttft_ms: u64,
    pub generate_ms: u64,
    /// Re-decoding the exchange without the HUD (and the tail after a prune).
    pub redecode_ms: u64,
    pub save_ms: u64,
    pub started_at: DateTime<Utc>,
}

impl KvLog {
    /// A blank log for a turn that starts now.
    pub fn start(path: TurnPath, sid: &str, n_ctx: u32) -> KvLog {
        KvLog {
            path,
            sid: sid.to_string(),
            loaded: false,
            cold: true,
            cold_reason: None,
            rebuild: None,
            tokens_loaded: 0,
            tokens_in_kv: 0,
            kv_bytes: 0,
            n_ctx,
            digest_injected: false,
            digest_version: String::new(),
            s_tokens: 0,
            u_tokens: 0,
            r_tokens: 0,
            finish_reason: None,
            bpt: 0,
            m_tokens: 0,
            memories_injected: 0,
            memory_keys: Vec::new(),
            recall_in_kv: 0,
            recall_ms: 0,
            context_injected: false,
            c_tokens: 0,
            context_version: String::new(),
            status: "OK",
            error: None,
            latency_ms: 0,
            load_ms: 0,
            prefill_ms: 0,
            prefill_tokens: 0,
            prompt_tokens: 0,
            hud_kept: false,
            kv_source: None,
            ttft_ms: 0,
            generate_ms: 0,
            redecode_ms: 0,
            save_ms: 0,
            started_at: Utc::now(),
        }
    }

    /// Marks the attempt failed.
    pub fn failed(mut self, error: &str) -> KvLog {
        self.status = "ERROR";
        self.error = Some(error.to_string());
        self
    }

    /// Closes the latency clock.
    pub fn finish(&mut self) {
        let elapsed = Utc::now() - self.started_at;
        self.latency_ms = elapsed.num_milliseconds().max(0) as u64;
    }

    /// Emits the seed's line at info level.
    pub fn emit(&self) {
        tracing::info!(target: "kv_only", "{self}");
    }

    /// The `turn_log` row for this attempt, keyed by column name.
    pub fn row(&self, turn: &ClaimedTurn) -> serde_json::Value {
        let mut row = serde_json::json!({
            "turn_id": turn.id.0,
            "attempt": turn.attempt,
            "worker_id": turn.owner,
            "path": self.path.as_str(),
            "sid": self.sid,
            "loaded": self.loaded,
            "cold": self.cold,
            "cold_reason": self.cold_reason,
            "rebuild": self.rebuild.map(Rebuild::as_str),
            "tokens_loaded": self.tokens_loaded,
            "tokens_in_kv": self.tokens_in_kv,
            "kv_bytes": self.kv_bytes,
            "n_ctx": self.n_ctx,
            "digest_injected": self.digest_injected,
            "digest_version": self.digest_version,
            "s_tokens": self.s_tokens,
            "u_tokens": self.u_tokens,
            "r_tokens": self.r_tokens,
            "bpt": self.bpt,
            "m_tokens": self.m_tokens,
            "memories_injected": self.memories_injected,
            "memory_keys": self.memory_keys,
            "recall_in_kv": self.recall_in_kv,
            "recall_ms": self.recall_ms.min(i32::MAX as u64),
            "context_injected": self.context_injected,
            "c_tokens": self.c_tokens,
            "context_version": self.context_version,
            "status": self.status,
            "error": self.error,
            "latency_ms": self.latency_ms.min(i32::MAX as u64),
            "load_ms": self.load_ms.min(i32::MAX as u64),
            "prefill_ms": self.prefill_ms.min(i32::MAX as u64),
            "prefill_tokens": self.prefill_tokens,
            "prompt_tokens": self.prompt_tokens,
            "hud_kept": self.hud_kept,
            "kv_source": self.kv_source,
            "ttft_ms": self.ttft_ms.min(i32::MAX as u64),
            "generate_ms": self.generate_ms.min(i32::MAX as u64),
            "redecode_ms": self.redecode_ms.min(i32::MAX as u64),
            "save_ms": self.save_ms.min(i32::MAX as u64),
            "started_at": self.started_at,
        });
        // Apart, as one more field would take json! past the default recursion limit.
        row["finish_reason"] = serde_json::json!(self.finish_reason.map(FinishReason::as_str));
        row
    }
}

impl fmt::Display for KvLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kv_only path={} sid={} loaded={} cold={} tokens_in_kv={} kv_bytes={} n_ctx={} \
             digest_injected={} digest_version={} S={} U={} R={} bpt={} status={} latency_ms={}",
            self.path.as_str(),
            self.sid,
            self.loaded,
            self.cold,
            self.tokens_in_kv,
            self.kv_bytes,
            self.n_ctx,
            self.digest_injected,
            short_version(&self.digest_version),
            self.s_tokens,
            self.u_tokens,
            self.r_tokens,
            self.bpt,
            self.status,
            self.latency_ms
        )?;
        // Issue 15's fields, after the seed's, which stay byte-exact.
        write!(
            f,
            " M={} memories_injected={} context_injected={} context_version={}",
            self.m_tokens,
            self.memories_injected,
            self.context_injected,
            short_version(&self.context_version)
        )
    }
}

/// The seed's sample lines show a 12-hex-digit prefix of the SHA-256.
fn short_version(v: &str) -> &str {
    if v.is_empty() {
        "none"
    } else {
        &v[..v.len().min(12)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_matches_the_seed_format() {
        let mut log = KvLog::start(TurnPath::KvOnly, "session_123", 4096);
        log.loaded = true;
        log.cold = false;
        log.tokens_in_kv = 1440;
        log.kv_bytes = 165_600_000;
        log.digest_version = "2c7f8a5b9d1e0000".into();
        log.u_tokens = 18;
        log.r_tokens = 40;
        log.bpt = 115;
        log.latency_ms = 71;
        assert_eq!(
            log.to_string(),
            "kv_only path=kv_only sid=session_123 loaded=true cold=false tokens_in_kv=1440 \
             kv_bytes=165600000 n_ctx=4096 digest_injected=false digest_version=2c7f8a5b9d1e \
             S=0 U=18 R=40 bpt=115 status=OK latency_ms=71 \
             M=0 memories_injected=0 context_injected=false context_version=none"
        );
    }
}
