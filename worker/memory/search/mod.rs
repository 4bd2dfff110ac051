//! Retrieval over both the facts and the dialogue: lexical (BM25 over the user's own term
//! statistics), semantic (MiniLM cosine over one user's message vectors, and over the
//! vectors of each message's span of turns), the question in a named speaker's voice and
//! time windows from the query, fused by a named ranker, so a question can be answered
//! from an extracted fact or from the exact turn that holds it, with provenance.
//!
//! The room's files: `words` (the text rules every leg shares), `lexical` (BM25),
//! `vector` (the nearest vectors, exact or through the index, and their backfill), `spans`
//! (the span vectors: filled after import, searched and spread to their turns), `rows`
//! (the candidate messages read back), `voice` (the question as its named speaker would
//! ask it), `messages` (the dialogue's legs fused) and `facts` (the extracted facts'
//! scoring).

pub mod cards;
mod facts;
mod lexical;
mod messages;
pub mod rank;
mod rows;
pub mod spans;
pub mod timeq;
mod vector;
mod voice;
mod words;

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use self::timeq::TimeWindow;
use super::embed::Role;
use super::store::{self, Scope};
use super::{MemoryError, MemoryService, RankerKind, Result};
use facts::fact_candidates;
use messages::message_candidates;
use rank::Signals;

pub use voice::first_person;
pub use words::{content_words, message_key, names, overlap, stem};

// The search's statements run unprepared (`persistent(false)`): Postgres then plans each
// with its parameters. A cached statement turns generic after five runs, and a generic
// plan cannot use the per-user GIN index for a tsquery built inside the statement, nor
// the (user_id, at) index under an optional as-of cut: at 100,000 messages the BM25
// statement went from under a millisecond to 296 ms, the newest-message lookup to 73 ms.

/// Candidates taken from each retriever before ranking.
const LEXICAL_CANDIDATES: i64 = 30;
const VECTOR_CANDIDATES: usize = 100;
const WINDOW_CANDIDATES: usize = 100;
/// Seed 002: at most this many missing vectors are filled per query.
pub const BACKFILL_PER_QUERY: usize = 8;
/// Facts considered per query (one user's; keep-80 keeps this small).
const FACT_CANDIDATES: i64 = 5000;

/// A search as the CLI and HTTP take it.
#[derive(Debug, Clone)]
pub struct SearchRequest {
    pub scope: Scope,
    pub query: String,
    pub limit: usize,
    pub as_of: Option<DateTime<Utc>>,
    pub ranker: RankerKind,
    /// Seed 002's strict mode: drop candidates that fail the relevance gate.
    pub strict: bool,
    /// Dialogue by this speaker is left out (a character's recall skips its own replies).
    pub skip_speaker: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HitKind {
    Memory,
    Message,
    Summary,
}

/// One ranked hit, with its provenance.
#[derive(Debug, Clone, Serialize)]
pub struct Hit {
    pub kind: HitKind,
    /// `memory:<id>` for facts; the caller's own message id for messages.
    pub id: String,
    pub text: String,
    pub score: f64,
    pub components: BTreeMap<String, f64>,
    /// The caller's message ids whose text this hit carries.
    pub source_message_ids: Vec<String>,
    pub session_id: Option<String>,
    pub speaker: Option<String>,
    pub at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub entity_refs: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SearchResponse {
    pub query: String,
    pub ranker: &'static str,
    pub as_of: Option<DateTime<Utc>>,
    /// False when no query vector could be made: scores are lexical only (seed 004).
    pub semantic: bool,
    /// The embedder the query's vector came from (its file's sha256 prefix); only vectors
    /// of the same model were compared with it.
    pub vector_model: Option<String>,
    /// The user's messages left out of the vector legs: no vector yet, or another model's
    /// (`kvmem memory reindex` embeds them). The lexical legs still search them.
    pub without_vector: i64,
    pub time_window: Option<TimeWindow>,
    pub hits: Vec<Hit>,
    /// The query's vector, for callers that compare other text with it (recall's gate)
    /// without embedding the query again. Not part of the JSON.
    #[serde(skip)]
    pub query_vector: Option<Vec<f32>>,
}

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

fn ranks<T: Copy + Eq + std::hash::Hash>(ordered: &[T]) -> HashMap<T, usize> {
    ordered.iter().enumerate().map(|(i, id)| (*id, i)).collect()
}
