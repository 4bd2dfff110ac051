//! `kvmem status`: the monitoring views in `sql/views/queue.sql`, printed for people.

use std::fmt::Write;

use sqlx::{PgPool, Row};

/// Renders the queue's state as text.
pub async fn report(pool: &PgPool) -> Result<String, sqlx::Error> {
    let mut out = String::new();
    let counts = sqlx::query(include_str!("../../sql/cmd/status_counts.sql"))
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
    let oldest = sqlx::query(include_str!("../../sql/cmd/status_oldest.sql"))
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
    let running = sqlx::query(include_str!("../../sql/cmd/status_running.sql"))
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
    let dead = sqlx::query(include_str!("../../sql/cmd/status_dead.sql"))
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
    let lat = sqlx::query(include_str!("../../sql/cmd/status_latency.sql"))
        .fetch_one(pool)
        .await?;
    let warm = sqlx::query(include_str!("../../sql/cmd/status_warm.sql"))
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
    out.push_str(&crate::summary::cli::status_report(pool).await?);
    Ok(out)
}
