//! Logging set-up: tracing to stderr, plain for people or JSON for log pipelines, with
//! llama.cpp's own logs routed through the same subscriber.

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, Settings};

/// Installs the global subscriber. `RUST_LOG` overrides the configured level.
pub fn init(settings: &Settings) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{},llama_cpp_2=warn,llama-cpp-2=warn,sqlx::postgres::notice=warn",
            settings.log_level
        ))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match settings.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Plain => builder.try_init(),
    };
    llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
}
