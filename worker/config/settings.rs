//! The settings' shape, one struct per section of the TOML files, so each service is handed
//! the part it reads and a setting's place says what it tunes.

use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::kinds::{
    flag, IdentityMode, KvType, LogFormat, MemoryRanker, SnapshotStoreKind, SystemMessage,
};

/// Everything the worker, the CLI and the tests can tune.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    pub turn: TurnSettings,
    pub engine: EngineSettings,
    pub snapshot: SnapshotSettings,
    #[serde(default)]
    pub db: DbSettings,
    pub queue: QueueSettings,
    #[serde(default = "every_default")]
    pub maintenance: MaintenanceSettings,
    pub http: HttpSettings,
    pub log: LogSettings,
    #[serde(default = "every_default")]
    pub memory: MemorySettings,
    #[serde(default = "every_default")]
    pub summary: SummarySettings,
}

/// `[turn]`: what a turn puts in the context and keeps in the KV (seed 000's budgets).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TurnSettings {
    #[serde(deserialize_with = "flag")]
    pub kv_only_enabled: bool,
    pub kv_tail_tokens: u32,
    pub reply_max_tokens: u32,
    pub digest_max_tokens: u32,
    pub hud_max_tokens: u32,
    pub base_prompt: String,
    /// Workers publish each reply as deltas while they generate it (NOTIFY on the turn's
    /// and the session's channel); off, a reply is seen only once it is stored.
    #[serde(default = "default_true", deserialize_with = "flag")]
    pub stream_deltas: bool,
}

/// `[engine]`: the model, llama.cpp's contexts and sampling.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EngineSettings {
    #[serde(default)]
    pub model_path: Option<PathBuf>,
    #[serde(default)]
    pub model_sha: Option<String>,
    pub n_ctx: u32,
    pub kv_type: KvType,
    pub n_threads: u32,
    pub n_batch: u32,
    /// llama.cpp contexts, one blocking thread each.
    pub slots: u32,
    /// Sessions one engine thread decodes together (1 = one at a time). Needs
    /// `queue.concurrency` of at least `slots` × this to fill its batches.
    #[serde(default = "default_one")]
    pub batch_sessions: u32,
    /// How long a turn waits for others to join its batch.
    #[serde(default = "default_batch_wait_ms")]
    pub batch_wait_ms: u64,
    pub temperature: f32,
    pub top_p: f32,
    pub sampling_seed: u32,
    /// Repetition penalty over the reply's last `repeat_last_n` tokens (1.0 = off).
    pub repeat_penalty: f32,
    pub repeat_last_n: i32,
    /// Layers llama.cpp puts on a GPU (0 = all on the CPU; more than the model has = all of
    /// them, KV included). Needs a build with a GPU feature (docs/operations.md#gpu).
    #[serde(default)]
    pub gpu_layers: u32,
    /// Which GPU, counted over the GPU devices llama.cpp lists (0 = the first).
    #[serde(default)]
    pub main_gpu: u32,
}

/// `[snapshot]`: where the KV snapshots live and how they are written.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SnapshotSettings {
    /// The snapshot files; with an object store, this worker's cache in front of it.
    pub dir: PathBuf,
    /// zstd on snapshot payloads.
    #[serde(deserialize_with = "flag")]
    pub compress: bool,
    /// `local` (files in `dir`) or `s3` (an S3-compatible object store, with `dir` as this
    /// worker's cache in front of it).
    #[serde(default)]
    pub store: SnapshotStoreKind,
    /// `http://host:port` of an S3-compatible server; unset = AWS.
    #[serde(default)]
    pub s3_endpoint: Option<String>,
    #[serde(default)]
    pub s3_bucket: Option<String>,
    #[serde(default = "default_s3_region")]
    pub s3_region: String,
    #[serde(default)]
    pub s3_access_key_id: Option<String>,
    #[serde(default, skip_serializing)]
    pub s3_secret_access_key: Option<String>,
    /// Snapshots are `<s3_prefix>/<scope>.llkv` in the bucket.
    #[serde(default = "default_s3_prefix")]
    pub s3_prefix: String,
    /// Bound on one object store request, retries included.
    #[serde(default = "default_s3_timeout_ms")]
    pub s3_timeout_ms: u64,
    /// The snapshot directory's cap in bytes: the least recently used snapshots are deleted
    /// to stay under it, in local mode (the only copy; a cold start rebuilds it) and in
    /// front of an object store. 0 = no cap in local mode.
    #[serde(default = "default_cache_bytes")]
    pub cache_bytes: u64,
}

/// `[db]`: the Postgres the queue, the memory and the summaries live in.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DbSettings {
    #[serde(default)]
    pub url: Option<String>,
}

/// `[queue]`: claiming turns, their leases, retries and the reaper.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct QueueSettings {
    pub concurrency: u32,
    /// Turns claimed per statement; above `concurrency` the extra ones wait in the worker
    /// with their leases held (a prefetch). 0 = `concurrency`: claim only what starts now.
    pub claim_batch: u32,
    /// Most completions committed in one transaction (group commit); 1 = one each.
    pub complete_batch: u32,
    pub lease_ms: u64,
    pub heartbeat_ms: u64,
    pub poll_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    pub shutdown_grace_ms: u64,
    pub lanes: Vec<String>,
    /// A worker prefers sessions whose last turn it ran (their snapshot is in its cache).
    #[serde(default = "default_true")]
    pub claim_affinity: bool,
    /// How long a session's head may wait for the worker that ran its last turn before any
    /// worker takes it.
    #[serde(default = "default_affinity_wait_ms")]
    pub affinity_wait_ms: u64,
}

/// `[maintenance]`: what keeps a running system tidy. Each worker requeues expired leases,
/// trims events and reply deltas, deletes finished rows, sweeps erased snapshot scopes and
/// keeps the snapshot directory under its cap (`worker/maintenance/`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MaintenanceSettings {
    /// How often expired leases are requeued, and events and reply deltas trimmed.
    #[serde(default = "default_reaper_ms")]
    pub reaper_ms: u64,
    /// `events` rows are deleted this long after they were written.
    #[serde(default = "default_events_retention_hours")]
    pub events_retention_hours: u64,
    /// Done memory and summary jobs and dropped memory jobs are deleted this long after they
    /// finished (a backend's job handle answers until then). 0 = kept.
    #[serde(default = "default_finished_retention_hours")]
    pub finished_retention_hours: u64,
    /// Dead turns (with their log rows) and failed memory and summary jobs are deleted this
    /// long after they finished. 0 = kept.
    #[serde(default = "default_failed_retention_hours")]
    pub failed_retention_hours: u64,
    /// `turn_log` rows are deleted this long after their attempt finished. 0 = kept.
    #[serde(default = "default_log_retention_hours")]
    pub log_retention_hours: u64,
    /// Quarantined `.bad` snapshots (files, and objects under `quarantine/`) are deleted
    /// this many days after they were moved aside. 0 = kept forever.
    #[serde(default = "default_quarantine_days")]
    pub quarantine_days: u64,
}

/// `[http]`: `kvmem serve`'s limits and token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HttpSettings {
    pub timeout_ms: u64,
    /// Bearer token for `kvmem serve`; required when it listens beyond loopback. Never
    /// shown by `/v1/info`.
    #[serde(default, skip_serializing)]
    pub token: Option<String>,
    pub max_body_bytes: usize,
    /// Requests served at once; more get 503 at once instead of queueing without bound.
    pub max_in_flight: u32,
    /// Upper bound for a request's `X-Timeout-Ms`.
    pub max_timeout_ms: u64,
    /// How long after its turn ended a repeat of a chat request without an
    /// `Idempotency-Key` may still be a retry of it (docs/http-api.md#retries).
    #[serde(default = "default_retry_window_ms")]
    pub retry_window_ms: u64,
    /// The header that names the caller's user when the body has no `user` (a front-end
    /// forwards its own, e.g. Open WebUI's `x-openwebui-user-id`).
    #[serde(default = "default_user_header")]
    pub user_header: String,
    /// A front-end's background task (a chat title, tags, follow-up suggestions) starts its
    /// user message with this; such a request is refused, never a turn or a memory. "":
    /// no marker.
    #[serde(default = "default_task_marker")]
    pub task_marker: String,
    /// Where a request's user comes from: `request`, `header` or `key`.
    #[serde(default)]
    pub identity: IdentityMode,
    /// Limits on the history a chat request without a known session imports.
    #[serde(default = "default_max_history_messages")]
    pub max_history_messages: usize,
    #[serde(default = "default_max_history_chars")]
    pub max_history_chars: usize,
    #[serde(default = "default_max_message_chars")]
    pub max_message_chars: usize,
    /// A chat request's system message: ignored, or taken as the character's persona.
    #[serde(default)]
    pub system_message: SystemMessage,
    /// The request header a front-end names its conversation with (a chat id); with it,
    /// a chat request without `session_id` goes to that conversation's session instead of
    /// the one its history matches. Empty: no such header (docs/http-api.md#front-ends).
    #[serde(default = "default_conversation_header")]
    pub conversation_header: String,
}

fn default_retry_window_ms() -> u64 {
    120_000
}

fn default_task_marker() -> String {
    "### Task:".into()
}

fn default_max_history_messages() -> usize {
    200
}

fn default_max_history_chars() -> usize {
    200_000
}

fn default_max_message_chars() -> usize {
    32_000
}

fn default_user_header() -> String {
    "x-user-id".to_string()
}

fn default_conversation_header() -> String {
    "x-conversation-id".into()
}

/// `[log]`: the log lines' format and filter.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LogSettings {
    pub format: LogFormat,
    pub level: String,
}

/// `[memory]`: long-term memory, its lane and the recall budget.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MemorySettings {
    /// The sentence-embedding GGUF (multilingual-e5-small by default, all-MiniLM-L6-v2 an
    /// option); missing = lexical-only memory.
    #[serde(default = "default_embed_model")]
    pub embed_model_path: Option<PathBuf>,
    /// Layers of the embedding model on the GPU `engine.main_gpu` (0 = the CPU).
    #[serde(default)]
    pub embed_gpu_layers: u32,
    #[serde(default)]
    pub ranker: MemoryRanker,
    /// Llama workers run memory-lane jobs (embedding, extraction, remember/forget) while
    /// none of their turns is generating.
    #[serde(default = "default_true")]
    pub lane: bool,
    /// Extract facts from dialogue with an LLM on the memory lane.
    #[serde(default)]
    pub extract: bool,
    /// The extraction model (seed 002's memoryLlm); unset = the chat model.
    #[serde(default)]
    pub extract_model_path: Option<PathBuf>,
    /// Recall in the turn: the entity cards and memories injected for a user message, at
    /// most this many tokens (0 = no recall).
    #[serde(default = "default_memory_max_tokens")]
    pub max_tokens: u32,
    /// Seed 002's keep-80 active facts per user.
    #[serde(default = "default_keep_user")]
    pub keep_user: u32,
    /// A user with at most this many messages is searched exactly (every vector compared);
    /// above it too while the user is so small a share of the message index that its
    /// filtered scan would cost more; otherwise the HNSW index answers. 0: always the index.
    #[serde(default = "default_exact_search_max")]
    pub exact_search_max: u32,
    /// Seed 002's keep-120 per lore subject.
    #[serde(default = "default_keep_lore")]
    pub keep_lore: u32,
}

/// `[summary]`: session summaries, their lane and the context budget.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SummarySettings {
    /// Llama workers run summary jobs while none of their turns is generating.
    #[serde(default = "default_true")]
    pub lane: bool,
    /// The summary model; unset = the chat model.
    #[serde(default)]
    pub model_path: Option<PathBuf>,
    /// Attempts at a valid session summary before it is stored as an error.
    #[serde(default = "default_summary_attempts")]
    pub max_attempts: u32,
    /// The context block in the turn (user context, last session summary, spine), at most
    /// this many tokens (0 = none).
    #[serde(default = "default_summary_max_tokens")]
    pub max_tokens: u32,
    /// Entries per in-process summary cache (seed 004's LRU bound).
    #[serde(default = "default_summary_cache")]
    pub cache_capacity: u64,
}

/// A section whose every field has a default, for a configuration that names none of
/// them: before the sections, such keys could all be left out, and still can.
fn every_default<T: DeserializeOwned>() -> T {
    serde_json::from_value(serde_json::json!({})).expect("every field has a default")
}

fn default_s3_region() -> String {
    "us-east-1".to_string()
}

fn default_s3_prefix() -> String {
    "kvmem/snapshots".to_string()
}

fn default_s3_timeout_ms() -> u64 {
    5000
}

fn default_cache_bytes() -> u64 {
    4 << 30
}

fn default_reaper_ms() -> u64 {
    5000
}

fn default_events_retention_hours() -> u64 {
    168
}

fn default_quarantine_days() -> u64 {
    7
}

fn default_finished_retention_hours() -> u64 {
    24
}

fn default_failed_retention_hours() -> u64 {
    168
}

fn default_log_retention_hours() -> u64 {
    720
}

fn default_one() -> u32 {
    1
}

fn default_batch_wait_ms() -> u64 {
    20
}

fn default_affinity_wait_ms() -> u64 {
    500
}

fn default_memory_max_tokens() -> u32 {
    120
}

fn default_summary_max_tokens() -> u32 {
    200
}

fn default_summary_attempts() -> u32 {
    3
}

fn default_summary_cache() -> u64 {
    10_000
}

fn default_embed_model() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    Some(PathBuf::from(home).join(".cache/kvmem/models/multilingual-e5-small.q4_0.gguf"))
}

fn default_true() -> bool {
    true
}

fn default_exact_search_max() -> u32 {
    2_000
}

fn default_keep_user() -> u32 {
    80
}

fn default_keep_lore() -> u32 {
    120
}
