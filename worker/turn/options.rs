//! A turn's own sampling as it travels on the turn row (`turns.options`): the shape the
//! chat endpoint writes and `kvmem_check_turn_options` admits, read back by the worker
//! that runs the turn.

use serde::Deserialize;
use serde_json::Value;

use crate::engine::Sampling;

/// `turns.options`: every field optional; none at all is the worker's configured sampling.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnOptions {
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub seed: Option<u32>,
    #[serde(default)]
    pub stop: Vec<String>,
    /// Capped at `REPLY_MAX_TOKENS` by [`TurnOptions::reply_max`].
    #[serde(default)]
    pub max_tokens: Option<u32>,
}

/// Why a turn row's options do not read back. The endpoint and the database check admit
/// only the shape above, so such a row is a bug no retry fixes: the worker fails the turn.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("the turn's options are unreadable: {0}")]
    Unreadable(#[source] serde_json::Error),
}

impl TurnOptions {
    /// The options of a turn row; `None` (a turn queued without them) is the default.
    pub fn from_row(options: Option<&Value>) -> Result<TurnOptions, OptionsError> {
        match options {
            None | Some(Value::Null) => Ok(TurnOptions::default()),
            Some(v) => serde_json::from_value(v.clone()).map_err(OptionsError::Unreadable),
        }
    }

    /// The reply's sampling for the engine.
    pub fn sampling(&self) -> Sampling {
        Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            seed: self.seed,
            stop: self.stop.clone(),
        }
    }

    /// The reply's token budget: the request's, never above `cap` (`REPLY_MAX_TOKENS`).
    pub fn reply_max(&self, cap: u32) -> u32 {
        self.max_tokens.map_or(cap, |m| m.clamp(1, cap))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_row_without_options_samples_as_configured() {
        assert_eq!(TurnOptions::from_row(None).unwrap(), TurnOptions::default());
        assert_eq!(
            TurnOptions::from_row(Some(&Value::Null)).unwrap(),
            TurnOptions::default()
        );
        assert_eq!(TurnOptions::default().reply_max(96), 96);
        assert_eq!(TurnOptions::default().sampling(), Sampling::default());
    }

    #[test]
    fn options_read_back_and_max_tokens_is_capped() {
        let o = TurnOptions::from_row(Some(&json!({
            "temperature": 0.5, "top_p": 0.9, "seed": 7, "stop": ["X"], "max_tokens": 500
        })))
        .unwrap();
        assert_eq!(o.sampling().seed, Some(7));
        assert_eq!(o.sampling().stop, vec!["X".to_string()]);
        assert_eq!(o.reply_max(96), 96);
        assert_eq!(o.reply_max(1000), 500);
        let bad = TurnOptions::from_row(Some(&json!({"n": 2})))
            .unwrap_err()
            .to_string();
        assert!(
            bad.starts_with("the turn's options are unreadable: "),
            "{bad}"
        );
        assert!(bad.contains("unknown field `n`"), "{bad}");
    }
}
