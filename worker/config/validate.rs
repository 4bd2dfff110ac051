//! The checks across settings that types cannot express (a tail within the context, a
//! heartbeat within the lease), run on every load so a bad combination stops start-up.

use super::error::ConfigError;
use super::kinds::{KvType, SnapshotStoreKind};
use super::settings::Settings;

/// A setting's error: `key` names the variable users set.
fn invalid(key: &'static str, problem: &str) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid {
        key,
        problem: problem.to_string(),
    })
}

impl Settings {
    /// Checks every setting, in the order of config/default.toml before it had sections,
    /// and names the first that is wrong.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.validate_model()?;
        self.validate_queue()?;
        self.validate_serving()
    }

    /// The context, the reply, the model pin and the snapshot store.
    fn validate_model(&self) -> Result<(), ConfigError> {
        let (turn, engine, snap) = (&self.turn, &self.engine, &self.snapshot);
        if engine.n_ctx < 64 {
            return invalid("N_CTX", "must be at least 64");
        }
        if turn.kv_tail_tokens == 0 || turn.kv_tail_tokens > engine.n_ctx {
            return invalid("KV_TAIL_TOKENS", "must be between 1 and N_CTX");
        }
        if turn.reply_max_tokens == 0 || turn.reply_max_tokens >= engine.n_ctx {
            return invalid("REPLY_MAX_TOKENS", "must be between 1 and N_CTX - 1");
        }
        if let Some(sha) = &engine.model_sha {
            if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                return invalid("MODEL_SHA", "must be 64 hex digits (a SHA-256)");
            }
        }
        if snap.store == SnapshotStoreKind::S3 {
            if snap.s3_bucket.as_deref().unwrap_or("").is_empty() {
                return invalid(
                    "KVMEM_S3_BUCKET",
                    "must be set when KVMEM_SNAPSHOT_STORE=s3",
                );
            }
            if snap.s3_access_key_id.is_some() != snap.s3_secret_access_key.is_some() {
                return invalid(
                    "KVMEM_S3_ACCESS_KEY_ID",
                    "set both KVMEM_S3_ACCESS_KEY_ID and KVMEM_S3_SECRET_ACCESS_KEY, or neither",
                );
            }
            if snap.s3_timeout_ms == 0 {
                return invalid("KVMEM_S3_TIMEOUT_MS", "must be at least 1");
            }
        }
        Ok(())
    }

    /// Turns in flight, group commits, engine slots and batching.
    fn validate_queue(&self) -> Result<(), ConfigError> {
        let (queue, engine) = (&self.queue, &self.engine);
        if queue.concurrency == 0 {
            return invalid("KVMEM_CONCURRENCY", "must be at least 1");
        }
        if queue.complete_batch == 0 {
            return invalid("KVMEM_COMPLETE_BATCH", "must be at least 1");
        }
        if engine.slots == 0 {
            return invalid("KVMEM_ENGINE_SLOTS", "must be at least 1");
        }
        // A generation step carries one token per session, in one llama.cpp batch; llama.cpp
        // allows at most 256 sequences in a context.
        if engine.batch_sessions == 0 || engine.batch_sessions > engine.n_batch.min(256) {
            return invalid(
                "KVMEM_BATCH_SESSIONS",
                "must be between 1 and the smaller of KVMEM_N_BATCH and 256",
            );
        }
        // With f16 or f32 KV, llama.cpp's CPU attention picks its kernel by batch shape (one
        // query row over 512+ cells, or 64+ rows, take kernels that round differently), so a
        // batched reply could differ from the one the session gets alone. With q8_0 every
        // shape takes the same kernel, and a reply does not depend on its batch.
        if engine.batch_sessions > 1 && engine.kv_type != KvType::Q8_0 {
            return invalid(
                "KVMEM_BATCH_SESSIONS",
                "above 1 needs KVMEM_KV_TYPE=q8_0: with f16 or f32 KV a batched reply can differ from the same turn run alone",
            );
        }
        Ok(())
    }

    /// Leases, sampling, the HTTP limits and the lanes.
    fn validate_serving(&self) -> Result<(), ConfigError> {
        let (queue, engine, http) = (&self.queue, &self.engine, &self.http);
        if queue.heartbeat_ms == 0 || queue.heartbeat_ms >= queue.lease_ms {
            return invalid(
                "KVMEM_HEARTBEAT_MS",
                "must be above 0 and below KVMEM_LEASE_MS",
            );
        }
        if !(0.0..=1.0).contains(&engine.top_p) || engine.temperature < 0.0 {
            return invalid(
                "KVMEM_TEMPERATURE",
                "temperature must be >= 0, top_p in 0..=1",
            );
        }
        if engine.repeat_penalty <= 0.0 || engine.repeat_last_n < -1 {
            return invalid(
                "KVMEM_REPEAT_PENALTY",
                "must be > 0 (1.0 = off), with KVMEM_REPEAT_LAST_N >= -1",
            );
        }
        if http.max_in_flight == 0 || http.max_body_bytes == 0 {
            return invalid(
                "KVMEM_HTTP_MAX_IN_FLIGHT",
                "it and KVMEM_HTTP_MAX_BODY_BYTES must be at least 1",
            );
        }
        let header_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if http.user_header.is_empty() || !http.user_header.chars().all(header_char) {
            return invalid(
                "KVMEM_HTTP_USER_HEADER",
                "must be a header name (letters, digits, '-' and '_')",
            );
        }
        if queue.lanes.is_empty() {
            return invalid("KVMEM_LANES", "must name at least one lane");
        }
        Ok(())
    }

    /// The database URL, or a clear error naming the variable.
    pub fn database_url(&self) -> Result<&str, ConfigError> {
        self.db
            .url
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or(ConfigError::Invalid {
                key: "DATABASE_URL",
                problem: "is not set (run `eval \"$(ops/pg start)\"` for a throwaway cluster)"
                    .into(),
            })
    }
}
