//! Memory-lane jobs queued from a shell (`kvmem memory remember` and `forget`) through the
//! SQL API a backend calls, and the queued extraction a process without the model leaves to
//! another: here so that the commands run no SQL of their own on `memory_jobs`.

use sqlx::PgPool;

use super::error::{MemoryError, Result};
use super::store::Scope;

/// Queues a remember of `text` with its entity refs for `scope` through `kvmem_remember`,
/// autocommit; the job's id (`sql/memory/queue_remember.sql`).
pub async fn queue_remember(
    pool: &PgPool,
    scope: &Scope,
    text: &str,
    entity_refs: &[String],
) -> Result<i64> {
    sqlx::query_scalar(include_str!("../../sql/memory/queue_remember.sql"))
        .bind(&scope.user_id)
        .bind(scope.character_id)
        .bind(text)
        .bind(&scope.guild_id)
        .bind(entity_refs)
        .fetch_one(pool)
        .await
        .map_err(refused)
}

/// Queues a forget of the facts matching `text` for `scope` through `kvmem_forget`,
/// autocommit; the job's id (`sql/memory/queue_forget.sql`).
pub async fn queue_forget(pool: &PgPool, scope: &Scope, text: &str) -> Result<i64> {
    sqlx::query_scalar(include_str!("../../sql/memory/queue_forget.sql"))
        .bind(&scope.user_id)
        .bind(scope.character_id)
        .bind(text)
        .bind(&scope.guild_id)
        .fetch_one(pool)
        .await
        .map_err(refused)
}

/// Queued jobs that ask for fact extraction (`sql/memory/extract_waiting.sql`).
pub async fn extraction_waiting(pool: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar(include_str!("../../sql/memory/extract_waiting.sql"))
            .fetch_one(pool)
            .await?,
    )
}

/// The SQL API's check of its input raises 22023 (`kvmem_memory_check`): bad input, not a
/// database failure.
fn refused(e: sqlx::Error) -> MemoryError {
    match &e {
        sqlx::Error::Database(d) if d.code().as_deref() == Some("22023") => {
            MemoryError::Invalid(d.message().to_string())
        }
        _ => MemoryError::Db(e),
    }
}
