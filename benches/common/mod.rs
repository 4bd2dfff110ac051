//! What the benchmark binaries share: a fresh, migrated database per suite and the
//! character their turns are addressed to.

use anyhow::{Context, Result};
use sqlx::{Connection, PgPool};

/// Drops and re-creates database `name` next to `base_url`'s, migrates it, and returns a
/// pool of `connections` with its URL.
pub async fn fresh_db(base_url: &str, name: &str, connections: u32) -> Result<(PgPool, String)> {
    let mut admin = sqlx::PgConnection::connect(base_url).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await?;
    let (head, _) = base_url
        .rsplit_once('/')
        .context("DATABASE_URL has no database path")?;
    let url = format!("{head}/{name}");
    let pool = kvmem::db::connect(&url, connections).await?;
    kvmem::db::migrate(&pool).await?;
    Ok((pool, url))
}

/// The benchmarks' character, owned by `user`.
pub async fn character(pool: &PgPool, user: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO user_characters (user_id, name, persona, current_health, max_health, wallet, stress_level, team_trust)
         VALUES ($1, 'Captain Vega', 'A calm starship captain.', 82, 100, 1250, 35, 70) RETURNING id",
    )
    .bind(user)
    .fetch_one(pool)
    .await?)
}
