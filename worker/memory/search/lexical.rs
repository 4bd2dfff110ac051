//! The lexical leg: Okapi BM25 over one user's messages with the user's own term
//! statistics, read inside Postgres.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::super::error::Result;
use super::super::store::Scope;

/// BM25's term-frequency saturation and length normalisation (the usual values).
pub(super) const BM25_K1: f64 = 1.2;
pub(super) const BM25_B: f64 = 0.75;
/// What a word of the reply-to context counts beside a word of the message itself.
pub(super) const BM25_CONTEXT_WEIGHT: f64 = 0.3;

/// How many query-term matches a search reads from a large user's history before it stops
/// pulling in the commoner terms' messages (they are still scored where another leg
/// brought the message). A user with fewer messages than this has every match read.
pub(super) const LEXICAL_MATCH_BUDGET: i64 = 500;

/// The user's messages ranked by BM25 for `query` (Postgres' English lexemes, the user's
/// own document frequencies), best first. `also` are scored whatever their terms' counts.
pub(super) async fn bm25_ids(
    pool: &PgPool,
    scope: &Scope,
    as_of: Option<DateTime<Utc>>,
    query: &str,
    limit: i64,
    also: &[i64],
) -> Result<Vec<(i64, f64)>> {
    let rows: Vec<(i64, f64)> =
        sqlx::query_as(include_str!("../../../sql/memory/search_messages_bm25.sql"))
            .persistent(false)
            .bind(&scope.user_id)
            .bind(scope.character_id)
            .bind(&scope.guild_id)
            .bind(as_of)
            .bind(query)
            .bind(BM25_K1)
            .bind(BM25_B)
            .bind(BM25_CONTEXT_WEIGHT)
            .bind(limit)
            .bind(LEXICAL_MATCH_BUDGET)
            .bind(also)
            .fetch_all(pool)
            .await?;
    Ok(rows)
}
