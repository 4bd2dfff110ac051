//! The memory layer's failures that are recorded rather than returned (an embedder that
//! will not load, a rejected fact, a failed job): the service, search and the lane's job
//! handlers all write them, so the writer sits below them all.

use sqlx::PgPool;

/// Records a memory-layer failure in `events`. Best effort: the events table may not
/// exist yet on a database the caller has not migrated.
pub async fn event(pool: &PgPool, kind: &str, reason: &str, user: Option<&str>) {
    let detail = serde_json::json!({ "reason": reason, "user_id": user });
    let res = sqlx::query(include_str!("../../sql/memory/event.sql"))
        .bind(kind)
        .bind(detail)
        .execute(pool)
        .await;
    if let Err(e) = res {
        tracing::warn!(kind, reason, error = %e, "could not record memory event");
    }
}
