//! Logging set-up: tracing to stderr, plain for people or JSON for log pipelines, with
//! llama.cpp's own logs routed through the same subscriber.

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, Settings};

/// llama.cpp's loader and context logs (about 40 lines per model load at info) are for
/// debugging llama.cpp, not for running kvmem: they are shown from `debug` on, and only
/// when asked for by target, e.g. `RUST_LOG=llama-cpp-2=debug`. kvmem's own one-line
/// summaries (`model loaded ...`) stay at info.
const QUIET_TARGETS: &str = "llama_cpp_2=warn,llama-cpp-2=warn,sqlx::postgres::notice=warn";

/// The filter: the configured level, the quiet targets, then `RUST_LOG` on top. A bare
/// level in `RUST_LOG` (`RUST_LOG=info`) does not reopen the quiet targets, since their
/// directives are more specific; naming a target does.
pub fn filter_directives(log_level: &str, rust_log: Option<&str>) -> String {
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        Some(extra) => format!("{log_level},{QUIET_TARGETS},{extra}"),
        None => format!("{log_level},{QUIET_TARGETS}"),
    }
}

/// Installs the global subscriber.
pub fn init(settings: &Settings) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = EnvFilter::builder()
        .parse_lossy(filter_directives(&settings.log.level, rust_log.as_deref()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match settings.log.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Plain => builder.try_init(),
    };
    llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;
    use tracing_subscriber::layer::SubscriberExt;

    /// `event_enabled!` needs its target as a literal: one probe per target.
    fn probe(target: &str, level: Level) -> bool {
        macro_rules! at {
            ($t:literal) => {
                match level {
                    Level::ERROR => tracing::event_enabled!(target: $t, Level::ERROR),
                    Level::WARN => tracing::event_enabled!(target: $t, Level::WARN),
                    Level::INFO => tracing::event_enabled!(target: $t, Level::INFO),
                    Level::DEBUG => tracing::event_enabled!(target: $t, Level::DEBUG),
                    Level::TRACE => tracing::event_enabled!(target: $t, Level::TRACE),
                }
            };
        }
        match target {
            "llama-cpp-2" => at!("llama-cpp-2"),
            _ => at!("kvmem"),
        }
    }

    /// The levels a filter built from `directives` lets through for `target`.
    fn enabled_at(directives: &str, target: &str) -> Vec<Level> {
        let filter = EnvFilter::builder().parse_lossy(directives);
        let subscriber = tracing_subscriber::registry().with(filter);
        tracing::subscriber::with_default(subscriber, || {
            [Level::ERROR, Level::WARN, Level::INFO, Level::DEBUG]
                .into_iter()
                .filter(|&level| probe(target, level))
                .collect()
        })
    }

    #[test]
    fn llama_logs_stay_quiet_unless_asked_for_by_name() {
        const ERROR: Level = Level::ERROR;
        const WARN: Level = Level::WARN;
        const INFO: Level = Level::INFO;
        const DEBUG: Level = Level::DEBUG;
        let default = filter_directives("info", None);
        assert_eq!(enabled_at(&default, "llama-cpp-2"), vec![ERROR, WARN]);
        assert_eq!(enabled_at(&default, "kvmem"), vec![ERROR, WARN, INFO]);
        // RUST_LOG=info used to replace the whole filter and bring back the loader lines.
        let bare = filter_directives("info", Some("info"));
        assert_eq!(enabled_at(&bare, "llama-cpp-2"), vec![ERROR, WARN]);
        let debug = filter_directives("debug", None);
        assert_eq!(enabled_at(&debug, "llama-cpp-2"), vec![ERROR, WARN]);
        assert_eq!(enabled_at(&debug, "kvmem"), vec![ERROR, WARN, INFO, DEBUG]);
        let named = filter_directives("info", Some("llama-cpp-2=debug"));
        assert_eq!(
            enabled_at(&named, "llama-cpp-2"),
            vec![ERROR, WARN, INFO, DEBUG]
        );
    }
}
