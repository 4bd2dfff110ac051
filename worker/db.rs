//! Connecting to Postgres and installing the schema: sqlx migrations for tables, then the
//! `sql/api` and `sql/views` files, which are replaced on every run so they track the binary.
//! A database a newer release migrated is run on when its newer migrations are additive
//! (their file is named `<version>_additive_<name>.sql`, which sqlx stores as the
//! description `additive <name>`), and refused otherwise; commands that only read never
//! migrate and refuse a schema behind the binary.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::migrate::{Migrate, MigrateError};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgConnection, PgPool};

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
    ("sql/api/chain.sql", include_str!("../sql/api/chain.sql")),
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
    #[error(
        "the database schema is behind this binary ({pending} migration(s) not applied, the \
         first {first}); `kvmem {command}` only reads and never migrates: run `kvmem migrate` \
         first (`kvmem migrate --status` lists them)"
    )]
    Behind {
        command: String,
        pending: usize,
        first: String,
    },
    #[error(
        "the database holds migrations of a newer kvmem release that are not additive: \
         {versions}. This binary would misread or break what they changed, so it does not \
         run on it: run the release that applied them, or a newer one (`kvmem migrate \
         --status` lists them; docs/operations.md, Upgrades and migrations)"
    )]
    Newer { versions: String },
    #[error(
        "the database holds migrations this binary does not know ({newer}) and lacks ones it \
         knows ({pending}): it was migrated by a build of another line of development; run \
         that build, or one that has both"
    )]
    Diverged { newer: String, pending: String },
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
            DbError::Migrate(_)
            | DbError::MissingExtension(_)
            | DbError::Behind { .. }
            | DbError::Newer { .. }
            | DbError::Diverged { .. } => false,
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

/// The description sqlx stores for a migration file named `<version>_additive_<name>.sql`
/// begins with this: the mark of a migration the previous release's binaries run on.
pub const ADDITIVE: &str = "additive ";

/// Whether a stored migration description marks the migration additive.
pub fn is_additive(description: &str) -> bool {
    description.starts_with(ADDITIVE)
}

/// One row of sqlx's `_sqlx_migrations`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AppliedMigration {
    pub version: i64,
    pub description: String,
    pub installed_on: DateTime<Utc>,
    /// False for a migration that failed half-way (sqlx calls the database dirty).
    pub success: bool,
}

impl AppliedMigration {
    pub fn additive(&self) -> bool {
        is_additive(&self.description)
    }
}

/// Where a database's schema stands against this binary's migrations.
#[derive(Debug, Default)]
pub struct SchemaState {
    /// This binary's migrations that the database records.
    pub applied: Vec<AppliedMigration>,
    /// This binary's migrations that the database lacks: version and description.
    pub pending: Vec<(i64, String)>,
    /// Migrations the database records that this binary does not know: a newer release's.
    pub newer: Vec<AppliedMigration>,
}

impl SchemaState {
    /// Reads `_sqlx_migrations` (all pending when it does not exist yet).
    pub async fn read(pool: &PgPool) -> Result<SchemaState, DbError> {
        let mut conn = pool.acquire().await.map_err(DbError::Connect)?;
        Self::read_on(&mut conn).await
    }

    async fn read_on(conn: &mut PgConnection) -> Result<SchemaState, DbError> {
        let exists: bool = sqlx::query_scalar(include_str!("../sql/db/migrations_table.sql"))
            .fetch_one(&mut *conn)
            .await
            .map_err(DbError::Connect)?;
        let rows: Vec<AppliedMigration> = if exists {
            sqlx::query_as(include_str!("../sql/db/applied_migrations.sql"))
                .fetch_all(&mut *conn)
                .await
                .map_err(DbError::Connect)?
        } else {
            Vec::new()
        };
        let mut recorded: HashMap<i64, AppliedMigration> =
            rows.into_iter().map(|r| (r.version, r)).collect();
        let mut state = SchemaState::default();
        for m in known() {
            match recorded.remove(&m.version) {
                Some(row) => state.applied.push(row),
                None => state.pending.push((m.version, m.description.to_string())),
            }
        }
        state.newer = recorded.into_values().collect();
        state.newer.sort_by_key(|m| m.version);
        Ok(state)
    }

    /// The newer release's migrations that are not marked additive.
    pub fn breaking(&self) -> Vec<&AppliedMigration> {
        self.newer.iter().filter(|m| !m.additive()).collect()
    }

    /// The first migration that failed half-way, if any.
    fn dirty(&self) -> Option<i64> {
        self.applied
            .iter()
            .chain(&self.newer)
            .find(|m| !m.success)
            .map(|m| m.version)
    }

    /// Whether this binary may run on the schema once its own migrations are applied:
    /// everything newer must be additive, and a newer schema must not also lack ours.
    pub fn check_runnable(&self) -> Result<(), DbError> {
        if let Some(v) = self.dirty() {
            return Err(MigrateError::Dirty(v).into());
        }
        let breaking = self.breaking();
        if !breaking.is_empty() {
            return Err(DbError::Newer {
                versions: listed(breaking.iter().map(|m| (m.version, &*m.description))),
            });
        }
        if !self.newer.is_empty() && !self.pending.is_empty() {
            return Err(DbError::Diverged {
                newer: listed(self.newer.iter().map(|m| (m.version, &*m.description))),
                pending: listed(self.pending.iter().map(|(v, d)| (*v, d.as_str()))),
            });
        }
        Ok(())
    }

    /// For a command that only reads: the schema must hold every migration of this binary
    /// (it never applies them itself) and be one it may run on.
    pub fn check_current(&self, command: &str) -> Result<(), DbError> {
        if let Some((version, description)) = self.pending.first() {
            return Err(DbError::Behind {
                command: command.to_string(),
                pending: self.pending.len(),
                first: format!("{version} {description}"),
            });
        }
        self.check_runnable()
    }
}

fn listed<'a>(migrations: impl Iterator<Item = (i64, &'a str)>) -> String {
    migrations
        .map(|(v, d)| format!("{v} ({d})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// This binary's migrations (sqlx's down migrations aside: kvmem has none).
fn known() -> impl Iterator<Item = &'static sqlx::migrate::Migration> {
    MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
}

/// For a command that only reads: the schema as it stands, or an error naming the command
/// to run when it is behind this binary (nothing is migrated here).
pub async fn require_current(pool: &PgPool, command: &str) -> Result<SchemaState, DbError> {
    let state = SchemaState::read(pool).await?;
    state.check_current(command)?;
    Ok(state)
}

/// What [`migrate`] did.
#[derive(Debug)]
pub struct Migrated {
    /// Versions this run applied.
    pub applied: Vec<i64>,
    /// A newer release's additive migrations the database holds: the schema is newer than
    /// this binary, which runs on it and leaves the SQL API and views as that release
    /// installed them.
    pub newer: Vec<AppliedMigration>,
}

/// Brings a database to the schema this binary expects: applies its missing migrations
/// and reinstalls the SQL API and views. On a schema a newer release migrated it applies
/// nothing and installs nothing when the newer migrations are all additive, and refuses
/// ([`DbError::Newer`]) when any is not.
pub async fn migrate(pool: &PgPool) -> Result<Migrated, DbError> {
    let missing: Vec<String> = sqlx::query_scalar(include_str!("../sql/db/extensions_missing.sql"))
        .fetch_all(pool)
        .await
        .map_err(DbError::Connect)?;
    if !missing.is_empty() {
        return Err(DbError::MissingExtension(missing.join(", ")));
    }
    let mut conn = pool.acquire().await.map_err(DbError::Connect)?;
    // sqlx's own migration lock, so binaries migrating side by side take turns; released
    // on every path, as the connection goes back to the pool holding it otherwise.
    conn.lock().await?;
    let ran = apply_known(&mut conn).await;
    let unlocked = conn.unlock().await;
    let migrated = ran?;
    unlocked?;
    drop(conn);
    if migrated.newer.is_empty() {
        install_replaceable(pool).await?;
    } else {
        tracing::warn!(
            newer = %listed(migrated.newer.iter().map(|m| (m.version, &*m.description))),
            "the database schema is newer than this binary (additive migrations only): \
             running on it, leaving the SQL API and views as the newer release installed them"
        );
    }
    Ok(migrated)
}

/// Under the migration lock: checks the recorded migrations, then applies this binary's
/// missing ones in order, as sqlx's `Migrator::run` would (which refuses any version it
/// does not know, additive or not).
async fn apply_known(conn: &mut PgConnection) -> Result<Migrated, DbError> {
    conn.ensure_migrations_table().await?;
    let state = SchemaState::read_on(conn).await?;
    state.check_runnable()?;
    let recorded: HashMap<i64, Vec<u8>> = conn
        .list_applied_migrations()
        .await?
        .into_iter()
        .map(|m| (m.version, m.checksum.into_owned()))
        .collect();
    let mut applied = Vec::new();
    for m in known() {
        match recorded.get(&m.version) {
            Some(sum) if **sum != *m.checksum => {
                return Err(MigrateError::VersionMismatch(m.version).into())
            }
            Some(_) => {}
            None => {
                conn.apply(m).await?;
                applied.push(m.version);
            }
        }
    }
    Ok(Migrated {
        applied,
        newer: state.newer,
    })
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
    // A newer release may have migrated since this binary looked: its functions and views
    // then stay, as an older binary's would not serve its workers.
    if !SchemaState::read_on(&mut tx).await?.newer.is_empty() {
        tracing::warn!("a newer release migrated the database meanwhile: SQL API left as it is");
        return Ok(());
    }
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
