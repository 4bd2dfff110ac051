//! Settings, layered so one binary serves dev, test and production: `config/default.toml`,
//! then `config/{KVMEM_ENV}.toml`, then the environment (seed 000's exact names, plus
//! `KVMEM_<KEY>` for every key). Each layer may use the sections (`[memory] ranker`) or the
//! flat keys of the first layout (`memory_ranker`); see [`keys`].

use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::Serialize;

mod error;
pub mod keys;
mod kinds;
mod settings;
mod validate;

pub use error::ConfigError;
pub use kinds::{IdentityMode, KvType, LogFormat, MemoryRanker, SnapshotStoreKind, SystemMessage};
pub use settings::{
    DbSettings, EngineSettings, HttpSettings, LogSettings, MemorySettings, QueueSettings, Settings,
    SnapshotSettings, SummarySettings, TurnSettings,
};

use keys::Sectioned;

impl Settings {
    /// Loads the layers from `dir` (normally `config/`) and the process environment.
    pub fn load_from(dir: &Path) -> Result<Settings, ConfigError> {
        Self::load_env_from(dir, "local")
    }

    /// Like [`Settings::load_from`], with `default_env` when `KVMEM_ENV` is unset.
    pub fn load_env_from(dir: &Path, default_env: &str) -> Result<Settings, ConfigError> {
        let env_name = std::env::var("KVMEM_ENV").unwrap_or_else(|_| default_env.into());
        let figment = Figment::new()
            .merge(Sectioned::file(Toml::file(dir.join("default.toml"))))
            .merge(Sectioned::file(Toml::file(
                dir.join(format!("{env_name}.toml")),
            )));
        Self::extract(environment(figment))
    }

    /// Loads from `KVMEM_CONFIG_DIR`, else `./config`, else the copy built into the binary.
    pub fn load(default_env: &str) -> Result<Settings, ConfigError> {
        let dir = std::env::var_os("KVMEM_CONFIG_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("config"));
        if dir.join("default.toml").exists() {
            return Self::load_env_from(&dir, default_env);
        }
        let figment = Figment::new().merge(built_in());
        Self::extract(environment(figment))
    }

    /// The built-in defaults, with nothing from files or the environment.
    pub fn defaults() -> Settings {
        Self::extract(Figment::new().merge(built_in())).expect("config/default.toml is valid")
    }

    /// Layers `overrides` (a serializable struct or map, sectioned or flat) over these
    /// settings.
    pub fn with(&self, overrides: impl Serialize) -> Result<Settings, ConfigError> {
        // Secrets are never serialized (so never shown), so they are carried over apart.
        let secrets = serde_json::json!({
            "http": { "token": self.http.token },
            "snapshot": { "s3_secret_access_key": self.snapshot.s3_secret_access_key },
        });
        Self::extract(
            Figment::new()
                .merge(Serialized::defaults(self))
                .merge(Serialized::defaults(secrets))
                .merge(Sectioned::file(Serialized::defaults(overrides))),
        )
    }

    fn extract(figment: Figment) -> Result<Settings, ConfigError> {
        let settings: Settings = figment.extract().map_err(Box::new)?;
        settings.validate()?;
        Ok(settings)
    }
}

/// The copy of `config/default.toml` built into the binary.
fn built_in() -> Sectioned<figment::providers::Data<Toml>> {
    Sectioned::file(Toml::string(include_str!("../../config/default.toml")))
}

/// `figment` with the environment over it: `KVMEM_<KEY>`, then the seed variables' plain
/// names, which win when both are set.
fn environment(figment: Figment) -> Figment {
    let flat = keys::flat_keys();
    figment
        .merge(Sectioned::env(
            Env::prefixed("KVMEM_").only(&flat),
            "KVMEM_",
        ))
        .merge(Sectioned::env(Env::raw().only(keys::SEED_VARS), ""))
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment's Jail closures return its large error.
mod tests;
