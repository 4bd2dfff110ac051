//! `kvmem status`: the monitoring views in `sql/views/queue.sql`, printed for people.

use std::fmt::Write;

use sqlx::{PgPool, Row};

/// Renders the queue's state as text.
pub async fn report(pool: &PgPool) -> Result<String, sqlx::Error> {
    let mut out = String::new();
    let counts = sqlx::query(
        "SELECT state::text AS state, sum(turns)::bigint AS turns FROM kvmem_queue_stats GROUP BY state ORDER BY state",
    )
    .fetch_all(pool)
    .await?;
    let _ = writeln!(out, "turns by state:");
    for r in &counts {
        let _ = writeln!(
            out,
            "  {:<8} {}",
            r.try_get::<String, _>("state")?,
            r.try_get::<i64, _>("turns")?
        );
    }
    let oldest = sqlx::query("SELECT lane, age_s, queued FROM kvmem_oldest_queued ORDER BY lane")
        .fetch_all(pool)
        .await?;
    let _ = writeln!(out, "oldest queued:");
    if oldest.is_empty() {
        let _ = writeln!(out, "  (queue empty)");
    }
    for r in &oldest {
        let _ = writeln!(
            out,
            "  {:<7} {:.1}s ({} queued)",
            r.try_get::<String, _>("lane")?,
            r.try_get::<f64, _>("age_s")?,
            r.try_get::<i64, _>("queued")?
        );
    }
    let running = sqlx::query(
        "SELECT turn_id, session_id, owner, lease_age_s, expires_in_s FROM kvmem_running ORDER BY turn_id LIMIT 50",
    )
    .fetch_all(pool)
    .await?;
    let _ = writeln!(out, "running ({}):", running.len());
    for r in &running {
        let _ = writeln!(
            out,
            "  turn {} sid={} owner={} lease_age={:.1}s expires_in={:.1}s",
            r.try_get::<i64, _>("turn_id")?,
            r.try_get::<String, _>("session_id")?,
            r.try_get::<Option<String>, _>("owner")?.unwrap_or_default(),
            r.try_get::<f64, _>("lease_age_s")?,
            r.try_get::<f64, _>("expires_in_s")?
        );
    }
    let dead = sqlx::query("SELECT turn_id, session_id, attempts, error FROM kvmem_dead LIMIT 20")
        .fetch_all(pool)
        .await?;
    let _ = writeln!(out, "dead ({} shown):", dead.len());
    for r in &dead {
        let _ = writeln!(
            out,
            "  turn {} sid={} attempts={} error={}",
            r.try_get::<i64, _>("turn_id")?,
            r.try_get::<String, _>("session_id")?,
            r.try_get::<i32, _>("attempts")?,
            r.try_get::<Option<String>, _>("error")?.unwrap_or_default()
        );
    }
    let lat = sqlx::query("SELECT turns, p50_ms, p95_ms FROM kvmem_latency")
        .fetch_one(pool)
        .await?;
    let warm = sqlx::query("SELECT warm, cold, warm_ratio FROM kvmem_warm_ratio")
        .fetch_one(pool)
        .await?;
    let _ = writeln!(
        out,
        "last hour: {} ok turns, p50 {:.0} ms, p95 {:.0} ms, warm {} / cold {}",
        lat.try_get::<i64, _>("turns")?,
        lat.try_get::<Option<f64>, _>("p50_ms")?.unwrap_or(0.0),
        lat.try_get::<Option<f64>, _>("p95_ms")?.unwrap_or(0.0),
        warm.try_get::<i64, _>("warm")?,
        warm.try_get::<i64, _>("cold")?
    );
    Ok(out)
}
