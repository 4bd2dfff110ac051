//! The vector leg: a user's nearest messages by cosine, exact for a small history and
//! through the HNSW index for a large one. It only reads: rows without a vector are left
//! to the lexical legs until the memory lane embeds them.

use pgvector::Vector;
use sqlx::PgPool;

use super::super::columns::Columns;
use super::super::error::Result;
use super::super::service::MemoryService;
use super::types::{SearchRequest, VECTOR_CANDIDATES};

/// HNSW candidates per search: the list the fusion reads is [`VECTOR_CANDIDATES`] long, and
/// the index's recall of the true top-100 drops fast below twice that.
pub(super) const EF_SEARCH: usize = 200;

/// The vector leg: the user's nearest messages by cosine, best first: exactly for a user
/// whose rows cost less to read than the filtered index scan ([`history`]), else
/// through the HNSW index.
pub(super) async fn nearest_messages(
    svc: &MemoryService,
    req: &SearchRequest,
    q: &Vector,
    exact: bool,
) -> Result<Vec<(i64, f64)>> {
    let sql = if exact {
        include_str!("../../../sql/memory/search_messages_vectors_exact.sql")
    } else {
        include_str!("../../../sql/memory/search_messages_vectors.sql")
    };
    let mut rows = nearest(svc, req, q, sql, exact, VECTOR_CANDIDATES as i64).await?;
    // The iterative scan returns its rows in roughly, not strictly, nearest-first order.
    rows.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(rows)
}

/// Runs one of the nearest-vector statements (exact, or through an HNSW index under the
/// index settings): every one takes the scope, the query vector and a row count alike.
pub(super) async fn nearest(
    svc: &MemoryService,
    req: &SearchRequest,
    q: &Vector,
    sql: &'static str,
    exact: bool,
    limit: i64,
) -> Result<Vec<(i64, f64)>> {
    let scope = &req.scope;
    // The index settings are transaction-local: a pooled connection goes back unchanged.
    let mut tx = svc.pool.begin().await?;
    if !exact {
        sqlx::query(include_str!("../../../sql/memory/hnsw_settings.sql"))
            .persistent(false)
            .bind(EF_SEARCH.to_string())
            .execute(&mut *tx)
            .await?;
    }
    let rows: Vec<(i64, f64)> = sqlx::query_as(svc.columns().sql(sql))
        .persistent(false)
        .bind(&scope.user_id)
        .bind(scope.character_id)
        .bind(&scope.guild_id)
        .bind(req.as_of)
        .bind(q)
        .bind(limit)
        .bind(svc.model_id())
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(rows)
}

/// What the vector legs will face in one user's history.
pub(super) struct History {
    /// Small enough to compare every vector: cheaper than the index at that size, and
    /// exact.
    pub(super) exact: bool,
    /// Messages without a vector of the query's model (none yet, or another model's
    /// before `kvmem memory reindex`): only the lexical legs can find them.
    pub(super) without_vector: i64,
    /// Current facts without a vector of the query's model: scored lexically.
    pub(super) facts_without_vector: i64,
}

pub(super) async fn history(svc: &MemoryService, user: &str) -> Result<History> {
    let (size, indexed, of_model): (i64, f64, i64) = sqlx::query_as(
        svc.columns()
            .sql(include_str!("../../../sql/memory/user_messages.sql")),
    )
    .persistent(false)
    .bind(user)
    .bind(svc.model_id())
    .fetch_one(&svc.pool)
    .await?;
    let facts_without: i64 =
        sqlx::query_scalar(include_str!("../../../sql/memory/facts_without_vector.sql"))
            .persistent(false)
            .bind(user)
            .bind(svc.model_id())
            .fetch_one(&svc.pool)
            .await?;
    Ok(History {
        exact: exact_is_cheaper(size, indexed, svc.config.exact_search_max),
        without_vector: (size - of_model).max(0),
        facts_without_vector: facts_without,
    })
}

/// The exact scan reads each of the user's rows once; the filtered index scan passes over
/// about `indexed / size` vectors of other users for each of theirs it returns. Measured
/// on the latency fill (1.11M vectors, two cores, vectors stored in the row): one exact
/// leg 12-15 ms for a user of 10,000 messages, about 1.4 ms per 1,000. Through the index
/// the whole vector-only search took 84-95 ms for that user (`indexed / size` 111) and
/// 18-24 ms for one of 100,000 (11); less the query's embedding (about 8 ms), 0.7-0.8 ms
/// and 0.9-1.5 ms per unit of `indexed / size`. With 0.9 taken, the two are equal where
/// `size² = 640 × indexed`: an estimate from two sizes, not a fit.
const EXACT_OVER_INDEX: f64 = 640.0;

/// Exact for a user of at most `max` messages (0: always the index), and above it while
/// the user is so small a share of the index that the filtered scan would cost more.
fn exact_is_cheaper(size: i64, indexed: f64, max: i64) -> bool {
    if max <= 0 {
        return false;
    }
    let size = size.max(0) as f64;
    size <= max as f64 || size * size <= EXACT_OVER_INDEX * indexed
}

/// The query's cosine with messages another leg brought in, where theirs is of `model`.
pub(super) async fn cosines(
    pool: &PgPool,
    user: &str,
    ids: &[i64],
    q: &Vector,
    model: Option<&str>,
) -> Result<Vec<(i64, f64)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_as(
        Columns::of_query(q).sql(include_str!("../../../sql/memory/message_cosines.sql")),
    )
    .persistent(false)
    .bind(user)
    .bind(ids)
    .bind(q)
    .bind(model)
    .fetch_all(pool)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::exact_is_cheaper;

    #[test]
    fn exact_below_the_floor_and_while_the_user_is_a_small_share_of_the_index() {
        // The floor alone: an unanalysed index (0 vectors) leaves the configured size.
        assert!(exact_is_cheaper(2_000, 0.0, 2_000));
        assert!(!exact_is_cheaper(2_001, 0.0, 2_000));
        // 1.11M vectors: 10,000² = 1e8 <= 640 × 1.11e6 = 7.1e8, exact; 100,000² = 1e10 is not.
        assert!(exact_is_cheaper(10_000, 1_110_000.0, 2_000));
        assert!(!exact_is_cheaper(100_000, 1_110_000.0, 2_000));
        // 111,000 vectors: the break-even is sqrt(640 × 111,000) = 8,429 messages.
        assert!(exact_is_cheaper(8_400, 111_000.0, 2_000));
        assert!(!exact_is_cheaper(8_500, 111_000.0, 2_000));
        // 0 forces the index, whatever the sizes.
        assert!(!exact_is_cheaper(10, 1_110_000.0, 0));
    }
}
