//! Rebuilding stored digests: reading a session's facts, building, and writing the row in
//! one transaction that claims the dirty markers, so concurrent rebuilds stay exact.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::context::tokens::TokenCount;
use crate::metrics::Metrics;

use super::text::{build, Built, Fact};

/// The stored digest of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub version: String,
    pub content: String,
}

/// Reads the session's facts and builds its digest (no write).
pub async fn build_for(
    pool: &PgPool,
    session_id: &str,
    max_tokens: usize,
    tok: &dyn TokenCount,
) -> Result<Built, sqlx::Error> {
    let rows: Vec<FactRow> = sqlx::query_as(include_str!("../../../sql/digest/active_facts.sql"))
        .bind(session_id)
        .fetch_all(pool)
        .await?;
    let facts: Vec<Fact> = rows.into_iter().map(Fact::from).collect();
    Ok(build(&facts, Utc::now(), max_tokens, tok))
}

/// A fact row as the digest queries return it; `Fact` itself stays free of sqlx.
#[derive(sqlx::FromRow)]
struct FactRow {
    #[sqlx(rename = "type")]
    fact_type: String,
    value: String,
    expires_at: Option<DateTime<Utc>>,
}

impl From<FactRow> for Fact {
    fn from(r: FactRow) -> Self {
        Fact {
            fact_type: r.fact_type,
            value: r.value,
            expires_at: r.expires_at,
        }
    }
}

/// A fact row of a several-session read, with the session it belongs to.
#[derive(sqlx::FromRow)]
struct SessionFactRow {
    session_id: String,
    #[sqlx(flatten)]
    fact: FactRow,
}

/// The stored digest columns of `current.sql`.
#[derive(sqlx::FromRow)]
struct StoredRow {
    digest_version: String,
    digest_content: String,
}

/// Which of the sessions handed to [`rebuild_batch`] it rebuilds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Only those whose dirty marker it could claim: a notification names a session, but
    /// another rebuilder may have rebuilt it already, or its write may still be in flight.
    Dirty,
    /// Every one: a turn needs its digest now, or an included fact expired.
    All,
}

/// One session's digest after a rebuild, and whether its stored row changed.
#[derive(Debug, Clone)]
pub struct Rebuilt {
    pub session_id: String,
    pub built: Built,
    pub changed: bool,
}

/// The most sessions one rebuild transaction takes, so it holds its locks briefly.
pub const MAX_BATCH: usize = 128;

/// Rebuilds and stores the digests of `sessions` in one transaction, so a batch costs one
/// read, one write and one commit however many sessions it holds.
pub async fn rebuild_batch(
    pool: &PgPool,
    sessions: &[String],
    pick: Pick,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<Vec<Rebuilt>, sqlx::Error> {
    let mut sessions = sessions.to_vec();
    sessions.sort();
    sessions.dedup();
    // Scope: the markers claimed, the facts read and the digests (and events) written.
    let mut tx = pool.begin().await?;
    let claimed: Vec<String> = sqlx::query_scalar(include_str!("../../../sql/digest/claim.sql"))
        .bind(&sessions)
        .fetch_all(&mut *tx)
        .await?;
    if pick == Pick::Dirty {
        sessions = claimed;
    }
    finish(tx, sessions, max_tokens, tok, metrics).await
}

/// Claims up to [`MAX_BATCH`] dirty markers of any sessions and rebuilds those sessions:
/// a polling rebuilder's step. Returns how many sessions it rebuilt.
pub async fn sweep(
    pool: &PgPool,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<usize, sqlx::Error> {
    let any: bool = sqlx::query_scalar(include_str!("../../../sql/digest/any_dirty.sql"))
        .fetch_one(pool)
        .await?;
    if !any {
        return Ok(0);
    }
    sweep_now(pool, max_tokens, tok, metrics).await
}

/// [`sweep`] without the look first: for a rebuilder whose last sweep found work.
pub(super) async fn sweep_now(
    pool: &PgPool,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<usize, sqlx::Error> {
    // Scope: as in `rebuild_batch`.
    let mut tx = pool.begin().await?;
    let claimed: Vec<String> = sqlx::query_scalar(include_str!("../../../sql/digest/sweep.sql"))
        .bind(MAX_BATCH as i64)
        .fetch_all(&mut *tx)
        .await?;
    Ok(finish(tx, claimed, max_tokens, tok, metrics).await?.len())
}

/// The rest of a rebuild transaction once its markers are claimed: each session's rebuild
/// lock, the facts, the build, the store, the commit. The claims and the locks make it
/// exact under concurrency: a write that commits after the read marks its session again,
/// and a rebuild that read older facts never stores its digest over a newer one.
async fn finish(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    mut sessions: Vec<String>,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<Vec<Rebuilt>, sqlx::Error> {
    if sessions.is_empty() {
        return Ok(Vec::new());
    }
    sessions.sort();
    sqlx::query(include_str!("../../../sql/digest/lock.sql"))
        .bind(&sessions)
        .execute(&mut *tx)
        .await?;
    let rows: Vec<SessionFactRow> =
        sqlx::query_as(include_str!("../../../sql/digest/active_facts_of.sql"))
            .bind(&sessions)
            .fetch_all(&mut *tx)
            .await?;
    let mut facts: HashMap<String, Vec<Fact>> = HashMap::new();
    for row in rows {
        facts
            .entry(row.session_id)
            .or_default()
            .push(row.fact.into());
    }
    let now = Utc::now();
    let mut out: Vec<Rebuilt> = sessions
        .into_iter()
        .map(|sid| {
            let own = facts.get(&sid).map_or(&[][..], Vec::as_slice);
            Rebuilt {
                built: build(own, now, max_tokens, tok),
                session_id: sid,
                changed: false,
            }
        })
        .collect();
    let changed = store(&mut tx, &out).await?;
    tx.commit().await?;
    for r in &mut out {
        r.changed = changed.contains(&r.session_id);
        if r.changed {
            metrics.digest_rebuilt();
        }
    }
    Ok(out)
}

/// Upserts the digests and records an event for each row written; returns their sessions.
async fn store(
    tx: &mut sqlx::PgConnection,
    rebuilt: &[Rebuilt],
) -> Result<HashSet<String>, sqlx::Error> {
    let text =
        |f: fn(&Rebuilt) -> &str| rebuilt.iter().map(|r| f(r).to_string()).collect::<Vec<_>>();
    let count = |f: fn(&Built) -> usize| {
        rebuilt
            .iter()
            .map(|r| f(&r.built) as i32)
            .collect::<Vec<_>>()
    };
    let expiry: Vec<Option<DateTime<Utc>>> =
        rebuilt.iter().map(|r| r.built.next_expiry_at).collect();
    let changed: Vec<String> = sqlx::query_scalar(include_str!("../../../sql/digest/store.sql"))
        .bind(text(|r| &r.session_id))
        .bind(text(|r| &r.built.version))
        .bind(text(|r| &r.built.content))
        .bind(count(|b| b.tokens))
        .bind(count(|b| b.fact_count))
        .bind(expiry)
        .fetch_all(tx)
        .await?;
    Ok(changed.into_iter().collect())
}

/// Rebuilds and stores a session's digest; returns it and whether its version changed.
pub async fn rebuild(
    pool: &PgPool,
    session_id: &str,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<(Built, bool), sqlx::Error> {
    let sessions = [session_id.to_string()];
    let mut done = rebuild_batch(pool, &sessions, Pick::All, max_tokens, tok, metrics).await?;
    let r = done.pop().expect("Pick::All rebuilds every session");
    Ok((r.built, r.changed))
}

/// Rebuilds the notified sessions whose markers are still there, in batches; returns how
/// many stored digests changed. Repeated names cost nothing: many writes to one session
/// before its rebuild ran are one rebuild.
pub async fn rebuild_notified(
    pool: &PgPool,
    sessions: &[String],
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<usize, sqlx::Error> {
    let mut sessions = sessions.to_vec();
    sessions.sort();
    sessions.dedup();
    let mut changed = 0;
    for chunk in sessions.chunks(MAX_BATCH) {
        let done = rebuild_batch(pool, chunk, Pick::Dirty, max_tokens, tok, metrics).await?;
        changed += done.iter().filter(|r| r.changed).count();
    }
    Ok(changed)
}

/// The digest a turn should use: the stored row, or a fresh build when there is none yet.
pub async fn current(
    pool: &PgPool,
    session_id: &str,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<Stored, sqlx::Error> {
    let row: Option<StoredRow> = sqlx::query_as(include_str!("../../../sql/digest/current.sql"))
        .bind(session_id)
        .fetch_optional(pool)
        .await?;
    if let Some(row) = row {
        return Ok(Stored {
            version: row.digest_version,
            content: row.digest_content,
        });
    }
    let (built, _) = rebuild(pool, session_id, max_tokens, tok, metrics).await?;
    Ok(Stored {
        version: built.version,
        content: built.content,
    })
}

/// Rebuilds every session that is dirty or has an expired fact in its digest.
pub async fn rebuild_due(
    pool: &PgPool,
    tok: &dyn TokenCount,
    max_tokens: usize,
    metrics: &Metrics,
) -> Result<usize, sqlx::Error> {
    let due: Vec<String> = sqlx::query_scalar(include_str!("../../../sql/digest/due.sql"))
        .fetch_all(pool)
        .await?;
    for chunk in due.chunks(MAX_BATCH) {
        rebuild_batch(pool, chunk, Pick::All, max_tokens, tok, metrics).await?;
    }
    Ok(due.len())
}
