//! A search run: the legs gathered for a request, then ranked, deduplicated and cut to its
//! limit.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::facts::fact_candidates;
use super::messages::{self, message_candidates};
use super::rank::{self, Signals};
use super::types::{Hit, SearchRequest, SearchResponse};
use super::voice::{self, first_person};
use super::words::content_words;
use super::{timeq, vector};
use crate::memory::embed::Role;
use crate::memory::error::{MemoryError, Result};
use crate::memory::ranker::RankerKind;
use crate::memory::service::MemoryService;
use crate::memory::store::{self, Scope};

async fn reference_time(
    pool: &PgPool,
    scope: &Scope,
    as_of: Option<DateTime<Utc>>,
) -> Result<DateTime<Utc>> {
    if let Some(t) = as_of {
        return Ok(t);
    }
    let latest: Option<DateTime<Utc>> =
        sqlx::query_scalar(include_str!("../../../sql/memory/latest_at.sql"))
            .persistent(false)
            .bind(&scope.user_id)
            .bind(&scope.guild_id)
            .bind(as_of)
            .fetch_optional(pool)
            .await?;
    Ok(latest.unwrap_or_else(Utc::now))
}

/// Every candidate the legs found for a request, unranked: what [`search`] ranks, and what
/// an evaluation reads to compare rankers on the same candidates.
pub struct Gathered {
    /// The time recency and windows are measured from.
    pub now: DateTime<Utc>,
    pub candidates: Vec<(Hit, Signals)>,
    /// The response without its hits.
    pub response: SearchResponse,
}

/// The legs of a search, run and joined, before any ranking.
pub async fn gather(svc: &MemoryService, req: &SearchRequest) -> Result<Gathered> {
    req.scope.validate()?;
    if req.query.trim().is_empty() {
        return Err(MemoryError::Invalid("--query must not be empty".into()));
    }
    if req.limit == 0 || req.limit > 200 {
        return Err(MemoryError::Invalid(
            "--limit must be between 1 and 200".into(),
        ));
    }
    let pool = &svc.pool;
    // The query's vector is made while Postgres finds the reference time, the speaker the
    // question names and the size of the user's history (exact or index): the model runs on
    // a blocking thread, so the round trips cost the search nothing.
    let (now, qvec, speaker, history) = tokio::join!(
        reference_time(pool, &req.scope, req.as_of),
        async {
            // The lexical-only ranker needs no query vector: skip the model call.
            if req.ranker == RankerKind::Lexical {
                return None;
            }
            svc.embed(vec![req.query.clone()], Role::Query).await?.pop()
        },
        async {
            match req.ranker {
                RankerKind::Hybrid => {
                    voice::named_speaker(pool, &req.scope.user_id, &req.query).await
                }
                _ => Ok(None),
            }
        },
        vector::history(svc, &req.scope.user_id)
    );
    let history = history?;
    let now = now?;
    let window = timeq::parse(&req.query, now);
    let qwords = content_words(&req.query);
    let voiced = match (speaker?, &qvec) {
        (Some(s), Some(_)) => {
            let text = first_person(&req.query, &s);
            svc.embed(vec![text], Role::Query)
                .await
                .and_then(|mut v| v.pop())
                .map(|v| (s, v))
        }
        _ => None,
    };
    let asked = messages::Asked {
        window: window.as_ref(),
        words: &qwords,
        vector: qvec.as_deref(),
        voice: voiced.as_ref().map(|(s, v)| (s.as_str(), v.as_slice())),
        exact: history.exact,
    };
    // The dialogue and the facts are separate tables on connections of their own.
    let (mut candidates, facts) = tokio::try_join!(
        message_candidates(svc, req, &asked),
        fact_candidates(svc, req, &qwords, qvec.as_deref())
    )?;
    candidates.extend(facts);
    Ok(Gathered {
        now,
        candidates,
        response: SearchResponse {
            query: req.query.clone(),
            ranker: req.ranker.as_str(),
            as_of: req.as_of,
            semantic: qvec.is_some(),
            vector_model: svc
                .model_id()
                .filter(|_| qvec.is_some())
                .map(str::to_string),
            without_vector: history.without_vector,
            facts_without_vector: history.facts_without_vector,
            time_window: window,
            hits: Vec::new(),
            query_vector: qvec,
        },
    })
}

/// Runs a search. Embedder trouble never fails it: the query then scores lexically.
pub async fn search(svc: &MemoryService, req: &SearchRequest) -> Result<SearchResponse> {
    let Gathered {
        now,
        candidates,
        mut response,
    } = gather(svc, req).await?;
    let mut hits = rank::rank(req.ranker, req.strict, now, candidates);
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
    response.hits = dedupe(hits, req.limit);
    Ok(response)
}

/// Drops near-identical hits (same normalised text), keeping the better one.
fn dedupe(hits: Vec<Hit>, limit: usize) -> Vec<Hit> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    for h in hits {
        let key = store::normalise_text(&h.text);
        if key.len() > 12 && !seen.insert(key) {
            continue;
        }
        out.push(h);
        if out.len() == limit {
            break;
        }
    }
    out
}
