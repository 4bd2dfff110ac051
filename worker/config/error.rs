//! The one error type of start-up configuration, apart from the loading and the checks
//! that both produce it.

/// A start-up configuration error. figment's message names the offending key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Figment(#[from] Box<figment::Error>),
    #[error("configuration: {key} {problem}")]
    Invalid { key: &'static str, problem: String },
}
