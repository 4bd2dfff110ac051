//! The candidate messages read back by id, with what the ranking needs of each.

use chrono::{DateTime, Utc};
use pgvector::Vector;
use sqlx::PgPool;

use super::super::columns::Columns;
use super::super::error::Result;
use super::types::ranks;

pub(super) fn channel_score(want: Option<&str>, have: Option<&str>) -> f64 {
    match (want, have) {
        (_, None) => 0.25,
        (Some(w), Some(h)) if w == h => 1.0,
        _ => 0.0,
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct MsgRow {
    pub(super) id: i64,
    pub(super) session_id: String,
    pub(super) message_id: String,
    pub(super) speaker: String,
    pub(super) text: String,
    pub(super) at: DateTime<Utc>,
    pub(super) channel_id: Option<String>,
    /// The query's cosine, when the fetch was given the query's vector.
    pub(super) cosine: Option<f64>,
}

/// The rows of `ids` (the user's only), in the order of `ids`, each with its cosine to `q`
/// when given and the row's vector is of `model`.
pub(super) async fn fetch_messages(
    pool: &PgPool,
    user: &str,
    ids: &[i64],
    q: Option<&Vector>,
    model: Option<&str>,
) -> Result<Vec<MsgRow>> {
    let mut out = sqlx::query_as::<_, MsgRow>(
        q.map_or(Columns::NARROW, Columns::of_query)
            .sql(include_str!("../../../sql/memory/messages_by_id.sql")),
    )
    .persistent(false)
    .bind(user)
    .bind(ids)
    .bind(q)
    .bind(model)
    .fetch_all(pool)
    .await?;
    let pos = ranks(ids);
    out.sort_by_key(|r| pos.get(&r.id).copied().unwrap_or(usize::MAX));
    Ok(out)
}
