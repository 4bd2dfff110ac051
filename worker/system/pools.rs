//! Every pool the system opens, opened here: as it is, migrated, checked against this
//! binary's schema, or waited for while the database is down. [`super::build`] picks one
//! by the caller's role; tests and benchmarks on a database of their own use [`connect_url`].

use std::time::Duration;

use sqlx::PgPool;

use super::error::SystemError;
use crate::config::Settings;

/// A pool on `settings`' database with room for `connections`, as it is (not migrated):
/// every command and service gets its pool here, so there is one place that opens one.
pub(super) async fn connect(settings: &Settings, connections: u32) -> Result<PgPool, SystemError> {
    connect_url(settings.database_url()?, connections).await
}

/// `connect` on a URL the caller holds rather than settings: a test's own throwaway
/// cluster, a benchmark's scratch database, a pool per simulated worker process.
pub async fn connect_url(url: &str, connections: u32) -> Result<PgPool, SystemError> {
    let pool = crate::db::connect(url, connections).await?;
    if let Ok(mut opened) = opened().lock() {
        *opened.entry(url.to_string()).or_default() += 1;
    }
    Ok(pool)
}

/// How many pools this process has opened on `url` through `connect` (and so through
/// [`super::build`]): one per command or
/// worker, however many services it runs (the wiring's own test reads it).
pub fn pools_opened(url: &str) -> usize {
    opened()
        .lock()
        .map(|o| o.get(url).copied().unwrap_or(0))
        .unwrap_or(0)
}

fn opened() -> &'static std::sync::Mutex<std::collections::HashMap<String, usize>> {
    static OPENED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, usize>>> =
        std::sync::OnceLock::new();
    OPENED.get_or_init(Default::default)
}

/// [`connect`], then migrates the database.
pub(super) async fn database(settings: &Settings, connections: u32) -> Result<PgPool, SystemError> {
    let pool = match connect(settings, connections).await {
        Err(SystemError::Config(e)) => return Err(SystemError::Settings(e.to_string())),
        other => other?,
    };
    crate::db::migrate(&pool).await?;
    Ok(pool)
}

/// [`connect`] for a command that only reads: it never migrates, and fails naming
/// `kvmem migrate` when the schema is behind this binary (`command` is how the message
/// names the command that refused).
pub(super) async fn connect_current(
    settings: &Settings,
    connections: u32,
    command: &str,
) -> Result<PgPool, SystemError> {
    let pool = connect(settings, connections).await?;
    crate::db::require_current(&pool, command).await?;
    Ok(pool)
}

/// [`database`] for a long-running worker: while the server is unavailable (down,
/// starting, restarting) it waits and tries again, from 250 ms doubling to 5 s, until the
/// server answers or `shutdown` fires (`Ok(None)`). Workers are started beside their
/// database, and one that came up a moment early must not exit. Other errors return at once.
pub(super) async fn database_when_ready(
    settings: &Settings,
    connections: u32,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<Option<PgPool>, SystemError> {
    let mut wait = Duration::from_millis(250);
    let mut attempt = 0u64;
    loop {
        attempt += 1;
        match database(settings, connections).await {
            Ok(pool) => return Ok(Some(pool)),
            Err(SystemError::Db(e)) if e.is_unavailable() => {
                tracing::warn!(attempt, retry_in_ms = wait.as_millis() as u64, error = %e,
                    "database unavailable at start; waiting for it");
            }
            Err(e) => return Err(e),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return Ok(None),
        }
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}
