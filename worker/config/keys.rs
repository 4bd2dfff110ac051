//! The settings were one flat list of keys (`memory_ranker`) before they had sections
//! (`memory.ranker`); files and environment variables written for the flat list keep
//! working because every layer is read through [`Sectioned`], which moves each flat key to
//! its section before figment merges the layers.

use figment::value::{Dict, Map, Value};
use figment::{Error, Metadata, Profile, Provider};

/// Seed 000's variables (and the recall and summary budgets, named like them), read from the
/// environment under their exact names; every key also reads `KVMEM_<KEY>`.
pub const SEED_VARS: &[&str] = &[
    "KV_ONLY_ENABLED",
    "KV_TAIL_TOKENS",
    "N_CTX",
    "REPLY_MAX_TOKENS",
    "DIGEST_MAX_TOKENS",
    "HUD_MAX_TOKENS",
    "MODEL_SHA",
    "KV_COMPRESS",
    "DATABASE_URL",
    "MEMORY_MAX_TOKENS",
    "SUMMARY_MAX_TOKENS",
];

/// Every setting's flat key (the TOML key before sections, and the environment variable's
/// name) and its `section.field`.
pub const FLAT_KEYS: &[(&str, &str)] = &[
    ("kv_only_enabled", "turn.kv_only_enabled"),
    ("kv_tail_tokens", "turn.kv_tail_tokens"),
    ("reply_max_tokens", "turn.reply_max_tokens"),
    ("digest_max_tokens", "turn.digest_max_tokens"),
    ("hud_max_tokens", "turn.hud_max_tokens"),
    ("base_prompt", "turn.base_prompt"),
    ("stream_deltas", "turn.stream_deltas"),
    ("model_path", "engine.model_path"),
    ("model_sha", "engine.model_sha"),
    ("n_ctx", "engine.n_ctx"),
    ("kv_type", "engine.kv_type"),
    ("n_threads", "engine.n_threads"),
    ("n_batch", "engine.n_batch"),
    ("engine_slots", "engine.slots"),
    ("batch_sessions", "engine.batch_sessions"),
    ("batch_wait_ms", "engine.batch_wait_ms"),
    ("temperature", "engine.temperature"),
    ("top_p", "engine.top_p"),
    ("sampling_seed", "engine.sampling_seed"),
    ("repeat_penalty", "engine.repeat_penalty"),
    ("repeat_last_n", "engine.repeat_last_n"),
    ("gpu_layers", "engine.gpu_layers"),
    ("main_gpu", "engine.main_gpu"),
    ("kv_dir", "snapshot.dir"),
    ("kv_compress", "snapshot.compress"),
    ("snapshot_store", "snapshot.store"),
    ("s3_endpoint", "snapshot.s3_endpoint"),
    ("s3_bucket", "snapshot.s3_bucket"),
    ("s3_region", "snapshot.s3_region"),
    ("s3_access_key_id", "snapshot.s3_access_key_id"),
    ("s3_secret_access_key", "snapshot.s3_secret_access_key"),
    ("s3_prefix", "snapshot.s3_prefix"),
    ("s3_timeout_ms", "snapshot.s3_timeout_ms"),
    ("kv_cache_bytes", "snapshot.cache_bytes"),
    ("kv_quarantine_days", "maintenance.quarantine_days"),
    ("database_url", "db.url"),
    ("concurrency", "queue.concurrency"),
    ("claim_batch", "queue.claim_batch"),
    ("complete_batch", "queue.complete_batch"),
    ("lease_ms", "queue.lease_ms"),
    ("heartbeat_ms", "queue.heartbeat_ms"),
    ("poll_ms", "queue.poll_ms"),
    ("reaper_ms", "maintenance.reaper_ms"),
    ("backoff_base_ms", "queue.backoff_base_ms"),
    ("backoff_max_ms", "queue.backoff_max_ms"),
    ("shutdown_grace_ms", "queue.shutdown_grace_ms"),
    ("lanes", "queue.lanes"),
    (
        "events_retention_hours",
        "maintenance.events_retention_hours",
    ),
    (
        "finished_retention_hours",
        "maintenance.finished_retention_hours",
    ),
    (
        "failed_retention_hours",
        "maintenance.failed_retention_hours",
    ),
    ("log_retention_hours", "maintenance.log_retention_hours"),
    ("claim_affinity", "queue.claim_affinity"),
    ("affinity_wait_ms", "queue.affinity_wait_ms"),
    ("http_timeout_ms", "http.timeout_ms"),
    ("http_token", "http.token"),
    ("http_max_body_bytes", "http.max_body_bytes"),
    ("http_max_in_flight", "http.max_in_flight"),
    ("http_max_timeout_ms", "http.max_timeout_ms"),
    ("http_retry_window_ms", "http.retry_window_ms"),
    ("http_user_header", "http.user_header"),
    ("http_identity", "http.identity"),
    ("http_task_marker", "http.task_marker"),
    ("http_max_history_messages", "http.max_history_messages"),
    ("http_max_history_chars", "http.max_history_chars"),
    ("http_max_message_chars", "http.max_message_chars"),
    ("http_system_message", "http.system_message"),
    ("http_conversation_header", "http.conversation_header"),
    ("log_format", "log.format"),
    ("log_level", "log.level"),
    ("memory_embed_model_path", "memory.embed_model_path"),
    ("memory_embed_gpu_layers", "memory.embed_gpu_layers"),
    ("memory_ranker", "memory.ranker"),
    ("memory_lane", "memory.lane"),
    ("memory_extract", "memory.extract"),
    ("memory_extract_model_path", "memory.extract_model_path"),
    ("memory_max_tokens", "memory.max_tokens"),
    ("memory_keep_user", "memory.keep_user"),
    ("memory_exact_search_max", "memory.exact_search_max"),
    ("memory_keep_lore", "memory.keep_lore"),
    ("summary_lane", "summary.lane"),
    ("summary_model_path", "summary.model_path"),
    ("summary_max_attempts", "summary.max_attempts"),
    ("summary_max_tokens", "summary.max_tokens"),
    ("summary_cache_capacity", "summary.cache_capacity"),
];

/// Settings that moved to another section, as `(old section.field, new section.field)`: a
/// file written for the old place keeps working.
pub const MOVED_KEYS: &[(&str, &str)] = &[
    ("queue.reaper_ms", "maintenance.reaper_ms"),
    (
        "queue.events_retention_hours",
        "maintenance.events_retention_hours",
    ),
    (
        "queue.finished_retention_hours",
        "maintenance.finished_retention_hours",
    ),
    (
        "queue.failed_retention_hours",
        "maintenance.failed_retention_hours",
    ),
    (
        "queue.log_retention_hours",
        "maintenance.log_retention_hours",
    ),
    ("snapshot.quarantine_days", "maintenance.quarantine_days"),
];

/// The environment variable that sets the setting at `section.field`, as the docs name it:
/// a seed variable's plain name, else `KVMEM_<FLAT KEY>`.
pub fn env_var(nested: &str) -> Option<String> {
    let flat = FLAT_KEYS.iter().find(|(_, n)| *n == nested)?.0;
    let plain = flat.to_ascii_uppercase();
    Some(match SEED_VARS.contains(&plain.as_str()) {
        true => plain,
        false => format!("KVMEM_{plain}"),
    })
}

/// The flat keys, as the list `Env::only` takes: the environment is read for these names
/// only, so an unrelated `KVMEM_` variable is ignored as it was before the sections.
pub fn flat_keys() -> Vec<&'static str> {
    FLAT_KEYS.iter().map(|(flat, _)| *flat).collect()
}

/// One layer read in either spelling and handed on in the sectioned one. Within a layer a
/// setting may be given once: a flat key and its `section.field` both set is an error
/// (which one was meant cannot be told); across layers the later one wins as always.
pub struct Sectioned<P> {
    inner: P,
    /// `Some(prefix)` for an environment layer: its keys are named as variables.
    env_prefix: Option<&'static str>,
    data: Result<Map<Profile, Dict>, Error>,
    /// The flat keys this layer used, so an error names the key as it was written.
    flat_seen: Vec<&'static str>,
}

impl<P: Provider> Sectioned<P> {
    /// A file or serialized layer.
    pub fn file(inner: P) -> Self {
        Self::read(inner, None)
    }

    /// An environment layer whose variables are `prefix` and the flat key, upper-cased.
    pub fn env(inner: P, prefix: &'static str) -> Self {
        Self::read(inner, Some(prefix))
    }

    // Read at once, so the interpolater knows which keys were flat before figment asks.
    fn read(inner: P, env_prefix: Option<&'static str>) -> Self {
        let mut flat_seen = Vec::new();
        let data = match inner.data() {
            Ok(profiles) => profiles
                .into_iter()
                .map(|(p, dict)| Ok((p, sectioned(dict, &mut flat_seen)?)))
                .collect::<Result<_, KeyClash>>()
                .map_err(|e| Error::from(e.to_string())),
            Err(e) => Err(e),
        };
        Sectioned {
            inner,
            env_prefix,
            data,
            flat_seen,
        }
    }
}

impl<P: Provider> Provider for Sectioned<P> {
    fn metadata(&self) -> Metadata {
        let (prefix, seen) = (self.env_prefix, self.flat_seen.clone());
        self.inner
            .metadata()
            .interpolater(move |_: &Profile, path: &[&str]| written(path, prefix, &seen))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, Error> {
        self.data.clone()
    }

    fn profile(&self) -> Option<Profile> {
        self.inner.profile()
    }
}

/// Why a layer's keys cannot be put in their sections: figment reports it as the layer's
/// error, with this text.
#[derive(Debug, thiserror::Error)]
enum KeyClash {
    #[error("`{flat}` belongs in section `{section}`, which is set to a value, not a table")]
    NotATable { flat: String, section: String },
    #[error("`{flat}` and `{nested}` are the same setting; set it once")]
    Twice { flat: String, nested: String },
}

/// `dict` with every flat key, and every moved key, in its section.
fn sectioned(mut dict: Dict, seen: &mut Vec<&'static str>) -> Result<Dict, KeyClash> {
    let moved = MOVED_KEYS.iter().filter_map(|&(old, nested)| {
        let (section, field) = old.split_once('.')?;
        match dict.get_mut(section) {
            Some(Value::Dict(_, table)) => Some((old, nested, table.remove(field)?)),
            _ => None,
        }
    });
    let moved: Vec<(&str, &str, Value)> = moved.collect();
    let flat = FLAT_KEYS
        .iter()
        .filter_map(|&(flat, nested)| Some((flat, nested, dict.remove(flat)?)));
    let flat: Vec<(&str, &str, Value)> = flat.collect();
    for (flat, nested, value) in moved.into_iter().chain(flat) {
        let (section, field) = nested.split_once('.').expect("section.field");
        let table = dict
            .entry(section.to_string())
            .or_insert_with(|| Value::from(Dict::new()));
        let Value::Dict(_, table) = table else {
            return Err(KeyClash::NotATable {
                flat: flat.to_string(),
                section: section.to_string(),
            });
        };
        if table.contains_key(field) {
            return Err(KeyClash::Twice {
                flat: flat.to_string(),
                nested: nested.to_string(),
            });
        }
        table.insert(field.to_string(), value);
        if let Some(&(flat, _)) = FLAT_KEYS.iter().find(|(f, _)| *f == flat) {
            seen.push(flat);
        }
    }
    Ok(dict)
}

/// The key at `path` as the layer's user wrote it: an environment variable's name, the flat
/// key when the layer used it, else `section.field`.
fn written(path: &[&str], env_prefix: Option<&str>, flat_seen: &[&str]) -> String {
    let nested = path.join(".");
    let flat = FLAT_KEYS
        .iter()
        .find(|(_, n)| *n == nested)
        .map(|(f, _)| *f);
    match (env_prefix, flat) {
        (Some(prefix), Some(flat)) => format!("{prefix}{}", flat.to_ascii_uppercase()),
        (None, Some(flat)) if flat_seen.contains(&flat) => flat.to_string(),
        _ => nested,
    }
}

/// The settings as the flat list of keys they were before sections (`memory_ranker`, not
/// `memory.ranker`): what `/v1/info` has always shown, so its readers see no change. Fields
/// that are never serialised (secrets) stay out.
pub fn flat_json(nested: &serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    FLAT_KEYS
        .iter()
        .filter_map(|(flat, path)| {
            let (section, field) = path.split_once('.')?;
            let v = nested.get(section)?.get(field)?;
            Some((flat.to_string(), v.clone()))
        })
        .collect()
}
