//! What the benchmark binaries share: a fresh, migrated database per suite and the
//! character their turns are addressed to.

use std::time::{Duration, Instant};

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
    let pool = kvmem::system::connect_url(&url, connections).await?;
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

/// p50, p95, max and count of `v` (nearest rank), for a latency column.
#[allow(dead_code)] // the process-level benches use it; kvmem_bench reports through its own tables
pub fn pcts(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| {
        if v.is_empty() {
            0.0
        } else {
            v[((v.len() - 1) as f64 * p).round() as usize]
        }
    };
    serde_json::json!({"p50": at(0.5), "p95": at(0.95), "max": at(1.0), "n": v.len()})
}

/// Waits for turn `id` to finish, polling every `poll` as a chat client would; fails if it
/// ends failed or dead, or is not done `within`.
#[allow(dead_code)] // not every bench waits on single turns
pub async fn wait_turn(pool: &PgPool, id: i64, within: Duration, poll: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let state: String = sqlx::query_scalar("SELECT state::text FROM turns WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await?;
        match state.as_str() {
            "done" => return Ok(()),
            "failed" | "dead" => anyhow::bail!("turn {id} ended {state}"),
            _ if Instant::now() > deadline => {
                anyhow::bail!("turn {id} not done in {} s", within.as_secs())
            }
            _ => tokio::time::sleep(poll).await,
        }
    }
}
