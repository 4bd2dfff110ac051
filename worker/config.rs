//! Settings, layered so one binary serves dev, test and production: `config/default.toml`,
//! then `config/{KVMEM_ENV}.toml`, then the environment (seed 000's exact names, plus
//! `KVMEM_<KEY>` for the rest).

use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Deserializer, Serialize};

/// Seed 000's variables, read from the environment under their exact names.
const SEED_VARS: &[&str] = &[
    "KV_ONLY_ENABLED",
    "KV_TAIL_TOKENS",
    "N_CTX",
    "REPLY_MAX_TOKENS",
    "DIGEST_MAX_TOKENS",
    "HUD_MAX_TOKENS",
    "MODEL_SHA",
    "KV_COMPRESS",
    "DATABASE_URL",
    // Issue 15's budgets, named like seed 000's.
    "MEMORY_MAX_TOKENS",
    "SUMMARY_MAX_TOKENS",
];

/// Everything the worker, the CLI and the tests can tune.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    #[serde(deserialize_with = "flag")]
    pub kv_only_enabled: bool,
    pub kv_tail_tokens: u32,
    pub n_ctx: u32,
    pub reply_max_tokens: u32,
    pub digest_max_tokens: u32,
    pub hud_max_tokens: u32,
    #[serde(default)]
    pub model_sha: Option<String>,
    #[serde(deserialize_with = "flag")]
    pub kv_compress: bool,
    #[serde(default)]
    pub database_url: Option<String>,

    #[serde(default)]
    pub model_path: Option<PathBuf>,
    pub kv_dir: PathBuf,
    pub kv_type: KvType,
    pub n_threads: u32,
    pub n_batch: u32,
    pub engine_slots: u32,
    /// Sessions one engine thread decodes together (1 = one at a time). Needs
    /// `concurrency` of at least `engine_slots` × this to fill its batches.
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
    pub base_prompt: String,

    pub concurrency: u32,
    /// Turns claimed per statement; above `concurrency` the extra ones wait in the worker
    /// with their leases held (a prefetch). 0 = `concurrency`: claim only what starts now.
    pub claim_batch: u32,
    /// Most completions committed in one transaction (group commit); 1 = one each.
    pub complete_batch: u32,
    pub lease_ms: u64,
    pub heartbeat_ms: u64,
    pub poll_ms: u64,
    pub reaper_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    pub shutdown_grace_ms: u64,
    pub lanes: Vec<String>,
    pub events_retention_hours: u64,
    pub http_timeout_ms: u64,
    /// Bearer token for `kvmem serve`; required when it listens beyond loopback. Never
    /// shown by `/v1/info`.
    #[serde(default, skip_serializing)]
    pub http_token: Option<String>,
    pub http_max_body_bytes: usize,
    /// Requests served at once; more get 503 at once instead of queueing without bound.
    pub http_max_in_flight: u32,
    /// Upper bound for a request's `X-Timeout-Ms`.
    pub http_max_timeout_ms: u64,
    /// Workers publish each reply as deltas while they generate it (NOTIFY on the turn's
    /// and the session's channel); off, a reply is seen only once it is stored.
    #[serde(default = "default_true", deserialize_with = "flag")]
    pub stream_deltas: bool,

    pub log_format: LogFormat,
    pub log_level: String,

    /// The sentence-embedding GGUF (all-MiniLM-L6-v2); missing = lexical-only memory.
    #[serde(default = "default_embed_model")]
    pub memory_embed_model_path: Option<PathBuf>,
    /// hybrid | weighted | recency-importance | lexical | vector.
    #[serde(default = "default_ranker")]
    pub memory_ranker: String,
    /// Llama workers run memory-lane jobs (embedding, extraction, remember/forget) while
    /// none of their turns is generating.
    #[serde(default = "default_true")]
    pub memory_lane: bool,
    /// Extract facts from dialogue with an LLM on the memory lane.
    #[serde(default)]
    pub memory_extract: bool,
    /// The extraction model (seed 002's memoryLlm); unset = the chat model.
    #[serde(default)]
    pub memory_extract_model_path: Option<PathBuf>,
    /// Recall in the turn: the entity cards and memories injected for a user message, at
    /// most this many tokens (0 = no recall).
    #[serde(default = "default_memory_max_tokens")]
    pub memory_max_tokens: u32,
    /// Seed 002's keep-80 active facts per user.
    #[serde(default = "default_keep_user")]
    pub memory_keep_user: u32,
    /// A user with at most this many messages is searched exactly (every vector compared);
    /// above it too while the user is so small a share of the message index that its
    /// filtered scan would cost more; otherwise the HNSW index answers. 0: always the index.
    #[serde(default = "default_exact_search_max")]
    pub memory_exact_search_max: u32,
    /// Seed 002's keep-120 per lore subject.
    #[serde(default = "default_keep_lore")]
    pub memory_keep_lore: u32,

    /// Llama workers run summary jobs (issue 14) while none of their turns is generating.
    #[serde(default = "default_true")]
    pub summary_lane: bool,
    /// The summary model; unset = the chat model.
    #[serde(default)]
    pub summary_model_path: Option<PathBuf>,
    /// Attempts at a valid session summary before it is stored as an error.
    #[serde(default = "default_summary_attempts")]
    pub summary_max_attempts: u32,
    /// The context block in the turn (user context, last session summary, spine), at most
    /// this many tokens (0 = none).
    #[serde(default = "default_summary_max_tokens")]
    pub summary_max_tokens: u32,
    /// Entries per in-process summary cache (seed 004's LRU bound).
    #[serde(default = "default_summary_cache")]
    pub summary_cache_capacity: u64,

    /// Where snapshots live: `local` (files in `kv_dir`) or `s3` (an S3-compatible object
    /// store, with `kv_dir` as this worker's cache in front of it).
    #[serde(default)]
    pub snapshot_store: SnapshotStoreKind,
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
    /// The local snapshot cache's cap in bytes, when snapshots live in an object store.
    #[serde(default = "default_kv_cache_bytes")]
    pub kv_cache_bytes: u64,
    /// A worker prefers sessions whose last turn it ran (their snapshot is in its cache).
    #[serde(default = "default_true")]
    pub claim_affinity: bool,
    /// How long a session's head may wait for the worker that ran its last turn before any
    /// worker takes it.
    #[serde(default = "default_affinity_wait_ms")]
    pub affinity_wait_ms: u64,
}

/// Where snapshots live.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotStoreKind {
    #[default]
    Local,
    S3,
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

fn default_kv_cache_bytes() -> u64 {
    4 << 30
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
    Some(PathBuf::from(home).join(".cache/kvmem/models/all-MiniLM-L6-v2.q8_0.gguf"))
}

fn default_true() -> bool {
    true
}

fn default_ranker() -> String {
    "hybrid".into()
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

/// KV cache element type; recorded in every snapshot header.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    F16,
    Q8_0,
    F32,
}

impl KvType {
    /// The name written into LLKV1 headers and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::F32 => "f32",
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Plain,
    Json,
}

/// A start-up configuration error. figment's message names the offending key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Figment(#[from] Box<figment::Error>),
    #[error("configuration: {key} {problem}")]
    Invalid { key: &'static str, problem: String },
}

/// A setting's error: `key` names the variable users set.
fn invalid(key: &'static str, problem: &str) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid {
        key,
        problem: problem.to_string(),
    })
}

impl Settings {
    /// Loads the layers from `dir` (normally `config/`) and the process environment.
    pub fn load_from(dir: &Path) -> Result<Settings, ConfigError> {
        Self::load_env_from(dir, "local")
    }

    /// Like [`Settings::load_from`], with `default_env` when `KVMEM_ENV` is unset.
    pub fn load_env_from(dir: &Path, default_env: &str) -> Result<Settings, ConfigError> {
        let env_name = std::env::var("KVMEM_ENV").unwrap_or_else(|_| default_env.into());
        let figment = Figment::new()
            .merge(Toml::file(dir.join("default.toml")))
            .merge(Toml::file(dir.join(format!("{env_name}.toml"))))
            .merge(Env::prefixed("KVMEM_").ignore(&["ENV", "CONFIG_DIR"]))
            .merge(Env::raw().only(SEED_VARS));
        Self::extract(figment)
    }

    /// Loads from `KVMEM_CONFIG_DIR`, else `./config`, else the copy built into the binary.
    pub fn load(default_env: &str) -> Result<Settings, ConfigError> {
        let dir = std::env::var_os("KVMEM_CONFIG_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("config"));
        if dir.join("default.toml").exists() {
            return Self::load_env_from(&dir, default_env);
        }
        let figment = Figment::new()
            .merge(Toml::string(include_str!("../config/default.toml")))
            .merge(Env::prefixed("KVMEM_").ignore(&["ENV", "CONFIG_DIR"]))
            .merge(Env::raw().only(SEED_VARS));
        Self::extract(figment)
    }

    /// The built-in defaults, with nothing from files or the environment.
    pub fn defaults() -> Settings {
        Self::extract(Figment::new().merge(Toml::string(include_str!("../config/default.toml"))))
            .expect("config/default.toml is valid")
    }

    /// Layers `overrides` (a serializable struct or map) over these settings.
    pub fn with(&self, overrides: impl Serialize) -> Result<Settings, ConfigError> {
        // Secrets are never serialized (so never shown), so they are carried over apart.
        let secrets = serde_json::json!({
            "http_token": self.http_token,
            "s3_secret_access_key": self.s3_secret_access_key,
        });
        Self::extract(
            Figment::new()
                .merge(Serialized::defaults(self))
                .merge(Serialized::defaults(secrets))
                .merge(Serialized::defaults(overrides)),
        )
    }

    fn extract(figment: Figment) -> Result<Settings, ConfigError> {
        let settings: Settings = figment.extract().map_err(Box::new)?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks every setting, in the order of config/default.toml, and names the first that
    /// is wrong.
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_model()?;
        self.validate_queue()?;
        self.validate_serving()
    }

    /// The context, the reply, the model pin and the snapshot store.
    fn validate_model(&self) -> Result<(), ConfigError> {
        if self.n_ctx < 64 {
            return invalid("N_CTX", "must be at least 64");
        }
        if self.kv_tail_tokens == 0 || self.kv_tail_tokens > self.n_ctx {
            return invalid("KV_TAIL_TOKENS", "must be between 1 and N_CTX");
        }
        if self.reply_max_tokens == 0 || self.reply_max_tokens >= self.n_ctx {
            return invalid("REPLY_MAX_TOKENS", "must be between 1 and N_CTX - 1");
        }
        if let Some(sha) = &self.model_sha {
            if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                return invalid("MODEL_SHA", "must be 64 hex digits (a SHA-256)");
            }
        }
        if self.snapshot_store == SnapshotStoreKind::S3 {
            if self.s3_bucket.as_deref().unwrap_or("").is_empty() {
                return invalid(
                    "KVMEM_S3_BUCKET",
                    "must be set when KVMEM_SNAPSHOT_STORE=s3",
                );
            }
            if self.s3_access_key_id.is_some() != self.s3_secret_access_key.is_some() {
                return invalid(
                    "KVMEM_S3_ACCESS_KEY_ID",
                    "set both KVMEM_S3_ACCESS_KEY_ID and KVMEM_S3_SECRET_ACCESS_KEY, or neither",
                );
            }
            if self.s3_timeout_ms == 0 {
                return invalid("KVMEM_S3_TIMEOUT_MS", "must be at least 1");
            }
        }
        Ok(())
    }

    /// Turns in flight, group commits, engine slots and batching.
    fn validate_queue(&self) -> Result<(), ConfigError> {
        if self.concurrency == 0 {
            return invalid("KVMEM_CONCURRENCY", "must be at least 1");
        }
        if self.complete_batch == 0 {
            return invalid("KVMEM_COMPLETE_BATCH", "must be at least 1");
        }
        if self.engine_slots == 0 {
            return invalid("KVMEM_ENGINE_SLOTS", "must be at least 1");
        }
        // A generation step carries one token per session, in one llama.cpp batch; llama.cpp
        // allows at most 256 sequences in a context.
        if self.batch_sessions == 0 || self.batch_sessions > self.n_batch.min(256) {
            return invalid(
                "KVMEM_BATCH_SESSIONS",
                "must be between 1 and the smaller of KVMEM_N_BATCH and 256",
            );
        }
        // With f16 or f32 KV, llama.cpp's CPU attention picks its kernel by batch shape (one
        // query row over 512+ cells, or 64+ rows, take kernels that round differently), so a
        // batched reply could differ from the one the session gets alone. With q8_0 every
        // shape takes the same kernel, and a reply does not depend on its batch.
        if self.batch_sessions > 1 && self.kv_type != KvType::Q8_0 {
            return invalid(
                "KVMEM_BATCH_SESSIONS",
                "above 1 needs KVMEM_KV_TYPE=q8_0: with f16 or f32 KV a batched reply can differ from the same turn run alone",
            );
        }
        Ok(())
    }

    /// Leases, sampling, the HTTP limits and the lanes.
    fn validate_serving(&self) -> Result<(), ConfigError> {
        if self.heartbeat_ms == 0 || self.heartbeat_ms >= self.lease_ms {
            return invalid(
                "KVMEM_HEARTBEAT_MS",
                "must be above 0 and below KVMEM_LEASE_MS",
            );
        }
        if !(0.0..=1.0).contains(&self.top_p) || self.temperature < 0.0 {
            return invalid(
                "KVMEM_TEMPERATURE",
                "temperature must be >= 0, top_p in 0..=1",
            );
        }
        if self.repeat_penalty <= 0.0 || self.repeat_last_n < -1 {
            return invalid(
                "KVMEM_REPEAT_PENALTY",
                "must be > 0 (1.0 = off), with KVMEM_REPEAT_LAST_N >= -1",
            );
        }
        if self.http_max_in_flight == 0 || self.http_max_body_bytes == 0 {
            return invalid(
                "KVMEM_HTTP_MAX_IN_FLIGHT",
                "it and KVMEM_HTTP_MAX_BODY_BYTES must be at least 1",
            );
        }
        if self.lanes.is_empty() {
            return invalid("KVMEM_LANES", "must name at least one lane");
        }
        Ok(())
    }

    /// The database URL, or a clear error naming the variable.
    pub fn database_url(&self) -> Result<&str, ConfigError> {
        self.database_url
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or(ConfigError::Invalid {
                key: "DATABASE_URL",
                problem: "is not set (run `eval \"$(ops/pg start)\"` for a throwaway cluster)"
                    .into(),
            })
    }
}

/// Accepts `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`: seed 000 writes both
/// `KV_ONLY_ENABLED=true` and `KV_COMPRESS=1`.
fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bool(bool),
        Int(i64),
        Str(String),
    }
    match Raw::deserialize(d)? {
        Raw::Bool(b) => Ok(b),
        Raw::Int(0) => Ok(false),
        Raw::Int(1) => Ok(true),
        Raw::Str(s) => match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            other => Err(serde::de::Error::custom(format!(
                "expected true/false or 1/0, found {other:?}"
            ))),
        },
        Raw::Int(n) => Err(serde::de::Error::custom(format!(
            "expected true/false or 1/0, found {n}"
        ))),
    }
}

#[cfg(test)]
// figment's Jail closures return figment's own (large) error type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    fn config_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config")
    }

    #[test]
    fn defaults_are_seed_000s() {
        let s = Settings::defaults();
        // KV_COMPRESS is the one default that departs from the seed (measured: see
        // config/default.toml).
        assert!(s.kv_only_enabled && !s.kv_compress);
        assert_eq!(
            (
                s.kv_tail_tokens,
                s.n_ctx,
                s.reply_max_tokens,
                s.digest_max_tokens,
                s.hud_max_tokens
            ),
            (2000, 4096, 800, 180, 40)
        );
        assert_eq!(s.model_sha, None);
    }

    #[test]
    fn every_config_file_parses() {
        for entry in std::fs::read_dir(config_dir()).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            figment::Jail::expect_with(|jail| {
                jail.clear_env();
                jail.set_env("KVMEM_ENV", &name);
                Settings::load_from(&config_dir()).map_err(|e| e.to_string())?;
                Ok(())
            });
        }
    }

    #[test]
    fn seed_variables_override_files() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("KV_TAIL_TOKENS", "256");
            jail.set_env("KV_COMPRESS", "1");
            jail.set_env("KV_ONLY_ENABLED", "false");
            jail.set_env("KVMEM_LEASE_MS", "20000");
            let s = Settings::load_from(&config_dir()).map_err(|e| e.to_string())?;
            assert_eq!(s.kv_tail_tokens, 256);
            assert!(s.kv_compress && !s.kv_only_enabled);
            assert_eq!(s.lease_ms, 20000);
            Ok(())
        });
    }

    #[test]
    fn a_bad_value_names_its_key() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("KV_TAIL_TOKENS", "lots");
            let err = Settings::load_from(&config_dir()).unwrap_err().to_string();
            assert!(err.to_lowercase().contains("kv_tail_tokens"), "{err}");
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.set_env("MODEL_SHA", "abc");
            let err = Settings::load_from(&config_dir()).unwrap_err().to_string();
            assert!(err.contains("MODEL_SHA"), "{err}");
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.set_env("KV_COMPRESS", "maybe");
            let err = Settings::load_from(&config_dir()).unwrap_err().to_string();
            assert!(err.to_lowercase().contains("kv_compress"), "{err}");
            Ok(())
        });
    }
}
