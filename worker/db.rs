//! Connecting to Postgres and installing the schema: sqlx migrations for tables, then the
//! `sql/api` and `sql/views` files, which are replaced on every run so they track the binary.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

/// The table migrations in `migrations/`, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Functions and views, re-created after the migrations. Order matters: views may use functions.
const REPLACEABLE_SQL: &[(&str, &str)] = &[
    (
        "sql/api/enqueue_turn.sql",
        include_str!("../sql/api/enqueue_turn.sql"),
    ),
    // Before turn_done.sql, whose notification also goes to the stream channels.
    ("sql/api/stream.sql", include_str!("../sql/api/stream.sql")),
    (
        "sql/api/turn_done.sql",
        include_str!("../sql/api/turn_done.sql"),
    ),
    (
        "sql/views/queue.sql",
        include_str!("../sql/views/queue.sql"),
    ),
    ("sql/memory/api.sql", include_str!("../sql/memory/api.sql")),
    ("sql/api/erase.sql", include_str!("../sql/api/erase.sql")),
    (
        "sql/views/memory.sql",
        include_str!("../sql/views/memory.sql"),
    ),
    (
        "sql/views/summary.sql",
        include_str!("../sql/views/summary.sql"),
    ),
];

/// Errors while connecting or migrating.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("cannot connect to Postgres: {0}")]
    Connect(#[source] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(
        "this PostgreSQL server has no {0} extension, which kvmem's memory search needs: \
         install pgvector (`ops/install-pgvector` builds it for PostgreSQL 15 on Debian; \
         elsewhere the postgresql-<major>-pgvector package) and run `kvmem migrate` again"
    )]
    MissingExtension(String),
    #[error("installing {file} failed: {source}")]
    Install {
        file: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

impl DbError {
    /// True when the server could not be reached or was not taking connections (down,
    /// starting up, shutting down, restarting): waiting may cure it. A bad URL, a wrong
    /// password or a migration that does not apply will not cure itself.
    pub fn is_unavailable(&self) -> bool {
        use sqlx::migrate::MigrateError;
        match self {
            DbError::Connect(e) | DbError::Install { source: e, .. } => unavailable(e),
            DbError::Migrate(MigrateError::Execute(e))
            | DbError::Migrate(MigrateError::ExecuteMigration(e, _)) => unavailable(e),
            DbError::Migrate(_) | DbError::MissingExtension(_) => false,
        }
    }
}

fn unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        // Class 08 is connection exceptions; 57P01-57P03 are admin shutdown, crash
        // shutdown and "cannot connect now" (the server is starting).
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}

/// Opens a pool. Statement logging is turned down: the queue's own spans say more.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    let options: PgConnectOptions = url
        .parse::<PgConnectOptions>()
        .map_err(DbError::Connect)?
        .disable_statement_logging();
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(DbError::Connect)
}

/// Brings a database to the schema this binary expects.
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    let missing: Vec<String> = sqlx::query_scalar(include_str!("../sql/db/extensions_missing.sql"))
        .fetch_all(pool)
        .await
        .map_err(DbError::Connect)?;
    if !missing.is_empty() {
        return Err(DbError::MissingExtension(missing.join(", ")));
    }
    MIGRATOR.run(pool).await?;
    install_replaceable(pool).await
}

async fn install_replaceable(pool: &PgPool) -> Result<(), DbError> {
    // One transaction: a failed install leaves the previous functions and views in place.
    let mut tx = pool.begin().await.map_err(|source| DbError::Install {
        file: "transaction",
        source,
    })?;
    // Workers starting together would otherwise race on DROP/CREATE of the same objects.
    sqlx::query(include_str!("../sql/db/install_lock.sql"))
        .execute(&mut *tx)
        .await
        .map_err(|source| DbError::Install {
            file: "advisory lock",
            source,
        })?;
    for (file, sql) in REPLACEABLE_SQL {
        sqlx::raw_sql(sql)
            .execute(&mut *tx)
            .await
            .map_err(|source| DbError::Install { file, source })?;
    }
    tx.commit().await.map_err(|source| DbError::Install {
        file: "commit",
        source,
    })
}
