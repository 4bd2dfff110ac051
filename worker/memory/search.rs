//! Retrieval over both the facts and the dialogue: lexical (BM25 over the user's own term
//! statistics), semantic (MiniLM cosine over one user's vectors) and time windows from the
//! query, fused by a named ranker, then lifted by who speaks, which session a topic lives
//! in and the turns around the best hits, so a question can be answered from an extracted
//! fact or from the exact turn that holds it, with provenance.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use pgvector::Vector;
use serde::Serialize;
use sqlx::{PgPool, Row};

use super::rank::{self, Signals};
use super::store::{self, Scope};
use super::timeq::{self, TimeWindow};
use super::{embed, MemoryError, MemoryService, RankerKind, Result};

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
    pub time_window: Option<TimeWindow>,
    pub hits: Vec<Hit>,
}

const STOPWORDS: &[&str] = &[
    "a",
    "about",
    "after",
    "again",
    "all",
    "am",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "been",
    "before",
    "being",
    "both",
    "but",
    "by",
    "can",
    "could",
    "did",
    "do",
    "does",
    "doing",
    "during",
    "each",
    "ever",
    "for",
    "from",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "here",
    "hers",
    "him",
    "his",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "just",
    "me",
    "my",
    "no",
    "nor",
    "not",
    "of",
    "off",
    "on",
    "once",
    "only",
    "or",
    "other",
    "our",
    "out",
    "over",
    "own",
    "said",
    "same",
    "she",
    "should",
    "so",
    "some",
    "such",
    "than",
    "that",
    "the",
    "their",
    "them",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "up",
    "very",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "why",
    "will",
    "with",
    "would",
    "you",
    "your",
    "yours",
    "ago",
    "last",
    "tell",
    "know",
    "remember",
    "mention",
    "mentioned",
    "s",
    "t",
    "much",
    "many",
    "does",
    "user",
];

/// Words that say nothing about what is asked once the time phrase is gone.
const VAGUE: &[&str] = &[
    "do",
    "happen",
    "happened",
    "happening",
    "going",
    "up",
    "get",
    "got",
    "go",
    "went",
    "make",
    "made",
    "anything",
    "something",
    "thing",
    "things",
    "day",
    "time",
    "plan",
    "plans",
];

/// How much a message says: distinct content words, capped; questions count half.
fn substance(text: &str) -> f64 {
    let n = content_words(text).len().min(12) as f64 / 12.0;
    if text.trim_end().ends_with('?') {
        n * 0.5
    } else {
        n
    }
}

/// The content words of a text: lowercase alphanumeric runs, stopwords dropped.
pub fn content_words(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in text.split(|c: char| !c.is_alphanumeric()) {
        let w = w.to_lowercase();
        if w.is_empty() || STOPWORDS.contains(&w.as_str()) || out.contains(&w) {
            continue;
        }
        out.push(w);
    }
    out
}

/// Light stemming so "hiking" meets "hike" in seed 002's overlap score.
pub fn stem(w: &str) -> &str {
    for suf in ["ing", "ed", "es", "s"] {
        if w.len() > suf.len() + 2 {
            if let Some(s) = w.strip_suffix(suf) {
                return s.trim_end_matches('e');
            }
        }
    }
    if w.len() > 3 {
        w.trim_end_matches('e')
    } else {
        w
    }
}

/// Seed 002's lexical score: the share of the query's content words found in the text
/// (1.0 when the whole query appears as a substring).
pub fn overlap(query_words: &[String], query: &str, text: &str) -> f64 {
    if query_words.is_empty() {
        return 0.0;
    }
    let compact = |s: &str| {
        s.chars()
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .collect::<String>()
    };
    let q = compact(query);
    if q.len() >= 6 && compact(text).contains(&q) {
        return 1.0;
    }
    let words: HashSet<String> = content_words(text)
        .iter()
        .map(|w| stem(w).to_string())
        .collect();
    let hit = query_words
        .iter()
        .filter(|w| words.contains(stem(w)))
        .count();
    hit as f64 / query_words.len() as f64
}

/// Names in a text (capitalised words not opening a sentence), for
/// seed 001's entity frequency on messages.
pub fn names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut sentence_start = true;
    for raw in text.split_whitespace() {
        let w: String = raw.chars().filter(|c| c.is_alphanumeric()).collect();
        let cap = w.chars().next().is_some_and(char::is_uppercase) && w.chars().count() >= 3;
        if cap && !sentence_start && !STOPWORDS.contains(&w.to_lowercase().as_str()) {
            let l = w.to_lowercase();
            if !out.contains(&l) {
                out.push(l);
            }
        }
        sentence_start = raw.ends_with(['.', '!', '?', ':']);
    }
    out
}

/// The text a message is embedded as: speaker and text, then the previous message of its
/// session as context (a contextual key), cut so the message itself dominates.
pub fn message_key(speaker: &str, text: &str, context: Option<&str>) -> String {
    match context {
        Some(c) if !c.trim().is_empty() => {
            let c: String = c.chars().take(160).collect();
            format!("{speaker}: {text} (reply to: {c})")
        }
        _ => format!("{speaker}: {text}"),
    }
}

struct MsgCand {
    signals: Signals,
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
        sqlx::query_scalar(include_str!("../../sql/memory/latest_at.sql"))
            .bind(&scope.user_id)
            .bind(&scope.guild_id)
            .bind(as_of)
            .fetch_one(pool)
            .await?;
    Ok(latest.unwrap_or_else(Utc::now))
}

/// BM25's term-frequency saturation and length normalisation (the usual values).
const BM25_K1: f64 = 1.2;
const BM25_B: f64 = 0.75;
/// What a word of the reply-to context counts beside a word of the message itself.
const BM25_CONTEXT_WEIGHT: f64 = 0.3;

/// The user's messages ranked by BM25 for `query` (Postgres' English lexemes, the user's
/// own document frequencies), best first.
async fn bm25_ids(
    pool: &PgPool,
    scope: &Scope,
    as_of: Option<DateTime<Utc>>,
    query: &str,
    limit: i64,
) -> Result<Vec<(i64, f64)>> {
    let rows: Vec<(i64, f64)> =
        sqlx::query_as(include_str!("../../sql/memory/search_messages_bm25.sql"))
            .bind(&scope.user_id)
            .bind(scope.character_id)
            .bind(&scope.guild_id)
            .bind(as_of)
            .bind(query)
            .bind(BM25_K1)
            .bind(BM25_B)
            .bind(BM25_CONTEXT_WEIGHT)
            .bind(limit)
            .fetch_all(pool)
            .await?;
    Ok(rows)
}

/// Runs a search. Embedder trouble never fails it: the query then scores lexically.
pub async fn search(svc: &MemoryService, req: &SearchRequest) -> Result<SearchResponse> {
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
    let now = reference_time(pool, &req.scope, req.as_of).await?;
    let window = timeq::parse(&req.query, now);
    let qwords = content_words(&req.query);
    // The lexical-only ranker needs no query vector: skip the model call.
    let qvec = if req.ranker == RankerKind::Lexical {
        None
    } else {
        match svc.embed(vec![req.query.clone()]).await {
            Some(mut v) => v.pop(),
            None => None,
        }
    };

    let mut hits = message_hits(svc, req, now, window.as_ref(), &qwords, qvec.as_deref()).await?;
    hits.extend(memory_hits(svc, req, now, &qwords, qvec.as_deref()).await?);
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
    let hits = dedupe(hits, req.limit);
    Ok(SearchResponse {
        query: req.query.clone(),
        ranker: req.ranker.as_str(),
        as_of: req.as_of,
        semantic: qvec.is_some(),
        time_window: window,
        hits,
    })
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

async fn message_hits(
    svc: &MemoryService,
    req: &SearchRequest,
    now: DateTime<Utc>,
    window: Option<&TimeWindow>,
    qwords: &[String],
    qvec: Option<&[f32]>,
) -> Result<Vec<Hit>> {
    let pool = &svc.pool;
    let scope = &req.scope;
    let lexical = bm25_ids(pool, scope, req.as_of, &req.query, LEXICAL_CANDIDATES).await?;
    let qv = qvec.map(|q| Vector::from(q.to_vec()));
    let vector = match &qv {
        Some(q) => nearest_messages(svc, req, q).await?,
        None => Vec::new(),
    };
    let mut cos: HashMap<i64, f64> = vector.iter().copied().collect();
    // Time-window list: the messages inside the window, ranked by what the query asks
    // beyond its time phrase. "What did I do in May?" asks nothing beyond it: then the
    // substantive statements of the window come first (content words, not questions).
    let mut window_list: Vec<i64> = Vec::new();
    if let Some(w) = window {
        let in_win: Vec<i64> =
            sqlx::query_scalar(include_str!("../../sql/memory/window_messages.sql"))
                .bind(&scope.user_id)
                .bind(scope.character_id)
                .bind(&scope.guild_id)
                .bind(req.as_of)
                .bind(w.start)
                .bind(w.end)
                .fetch_all(pool)
                .await?;
        if let Some(q) = &qv {
            let need: Vec<i64> = in_win
                .iter()
                .filter(|id| !cos.contains_key(id))
                .copied()
                .collect();
            cos.extend(cosines(pool, &scope.user_id, &need, q).await?);
        }
        let phrase: Vec<String> = content_words(&w.phrase);
        let rest: Vec<String> = qwords
            .iter()
            .filter(|x| {
                !phrase.contains(x) && !VAGUE.contains(&x.as_str()) && x.parse::<i32>().is_err()
            })
            .cloned()
            .collect();
        let rows = fetch_messages(pool, &scope.user_id, &in_win).await?;
        let mut scored: Vec<(i64, f64)> = rows
            .iter()
            .map(|r| {
                let score = if rest.is_empty() {
                    substance(&r.text)
                } else {
                    0.5 * overlap(&rest, "", &r.text)
                        + 0.5 * cos.get(&r.id).copied().unwrap_or(0.0).max(0.0)
                };
                (r.id, score)
            })
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        window_list = scored
            .into_iter()
            .take(WINDOW_CANDIDATES)
            .map(|x| x.0)
            .collect();
    }
    let lex_order: Vec<i64> = lexical.iter().map(|x| x.0).collect();
    if let Some(q) = &qv {
        let need: Vec<i64> = lex_order
            .iter()
            .filter(|id| !cos.contains_key(id))
            .copied()
            .collect();
        cos.extend(cosines(pool, &scope.user_id, &need, q).await?);
    }
    let vec_order: Vec<i64> = vector.iter().take(VECTOR_CANDIDATES).map(|x| x.0).collect();
    let mut ids: Vec<i64> = lex_order.clone();
    for id in vec_order.iter().chain(window_list.iter()) {
        if !ids.contains(id) {
            ids.push(*id);
        }
    }
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut rows = fetch_messages(pool, &scope.user_id, &ids).await?;
    // Seed 002's backfill: a few candidates without vectors get one now.
    if let Some(q) = qvec {
        backfill(svc, q, &mut rows, &mut cos).await;
    }
    let lex_rank = ranks(&lex_order);
    let vec_rank = ranks(&vec_order);
    let win_rank = ranks(&window_list);

    let mut cands: Vec<(MsgRow, MsgCand)> = rows
        .into_iter()
        .map(|row| {
            let text = format!("{} {}", row.speaker, row.text);
            let s = Signals {
                lexical_rank: lex_rank.get(&row.id).copied(),
                lexical: overlap(qwords, &req.query, &text),
                semantic: if qvec.is_some() {
                    cos.get(&row.id).copied()
                } else {
                    None
                },
                vector_rank: vec_rank.get(&row.id).copied(),
                // A message is what was said, not an inferred fact: full confidence.
                confidence: 1.0,
                at: Some(row.at),
                channel: channel_score(scope.channel_id.as_deref(), row.channel_id.as_deref()),
                entity_freq: 0.0,
                in_window: window.map(|w| w.contains(row.at)),
                window_rank: win_rank.get(&row.id).copied(),
            };
            (row, MsgCand { signals: s })
        })
        .collect();
    // Seed 001's entity frequency over the candidate set.
    let ents: Vec<Vec<String>> = cands.iter().map(|(r, _)| names(&r.text)).collect();
    for ((_, c), f) in cands.iter_mut().zip(rank::entity_frequency(&ents)) {
        c.signals.entity_freq = f;
    }
    let mut scored: Vec<(MsgRow, rank::Scored)> = Vec::new();
    for (row, c) in cands {
        let sc = rank::score(req.ranker, &c.signals, now);
        if req.strict && !sc.passes_gate {
            continue;
        }
        if req.ranker == RankerKind::Lexical && c.signals.lexical_rank.is_none() {
            continue;
        }
        if req.ranker == RankerKind::Vector && c.signals.vector_rank.is_none() {
            continue;
        }
        scored.push((row, sc));
    }
    if req.ranker == RankerKind::Hybrid {
        prefer_named_speakers(pool, &scope.user_id, &req.query, &mut scored).await?;
        with_neighbours(pool, req, &mut scored).await?;
    }
    Ok(scored
        .into_iter()
        .filter(|(row, _)| req.skip_speaker.as_deref() != Some(row.speaker.as_str()))
        .map(|(row, sc)| Hit {
            kind: HitKind::Message,
            id: row.message_id.clone(),
            text: row.text,
            score: sc.score,
            components: sc.components,
            source_message_ids: vec![row.message_id],
            session_id: Some(row.session_id),
            speaker: Some(row.speaker),
            at: Some(row.at),
            entity_refs: Vec::new(),
        })
        .collect())
}

/// HNSW candidates per search: the list the fusion reads is [`VECTOR_CANDIDATES`] long, and
/// the index's recall of the true top-100 drops fast below twice that.
const EF_SEARCH: usize = 200;

/// The vector leg: the user's nearest messages by cosine, best first. A user with at most
/// `exact_search_max` messages is searched exactly (cheaper than the index at that size,
/// and exact); a larger one through the HNSW index.
async fn nearest_messages(
    svc: &MemoryService,
    req: &SearchRequest,
    q: &Vector,
) -> Result<Vec<(i64, f64)>> {
    let scope = &req.scope;
    let size: i64 = sqlx::query_scalar(include_str!("../../sql/memory/user_messages.sql"))
        .bind(&scope.user_id)
        .fetch_one(&svc.pool)
        .await?;
    let exact = size <= svc.config.exact_search_max;
    let sql = if exact {
        include_str!("../../sql/memory/search_messages_vectors_exact.sql")
    } else {
        include_str!("../../sql/memory/search_messages_vectors.sql")
    };
    // The index settings are transaction-local: a pooled connection goes back unchanged.
    let mut tx = svc.pool.begin().await?;
    if !exact {
        sqlx::query(include_str!("../../sql/memory/hnsw_settings.sql"))
            .bind(EF_SEARCH.to_string())
            .execute(&mut *tx)
            .await?;
    }
    let mut rows: Vec<(i64, f64)> = sqlx::query_as(sql)
        .bind(&scope.user_id)
        .bind(scope.character_id)
        .bind(&scope.guild_id)
        .bind(req.as_of)
        .bind(q)
        .bind(VECTOR_CANDIDATES as i64)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    // The iterative scan returns its rows in roughly, not strictly, nearest-first order.
    rows.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(rows)
}

/// The query's cosine with messages another leg brought in.
async fn cosines(pool: &PgPool, user: &str, ids: &[i64], q: &Vector) -> Result<Vec<(i64, f64)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(
        sqlx::query_as(include_str!("../../sql/memory/message_cosines.sql"))
            .bind(user)
            .bind(ids)
            .bind(q)
            .fetch_all(pool)
            .await?,
    )
}

/// How much a question that names a speaker prefers that speaker's own words: "what did
/// Ana say about Porto" is answered by what Ana said before what was said to her.
const SPEAKER_BOOST: f64 = 0.4;
/// A message takes this share of its best neighbour's score: the turn that answers ("yes,
/// twice!") often shares no word with the question its neighbour asked.
const NEIGHBOUR_SHARE: f64 = 0.5;
/// Candidates whose neighbours are looked up.
const NEIGHBOUR_SOURCES: usize = 40;
/// A candidate lifts its neighbours only on evidence of its own (a BM25 match, or a cosine
/// this close): in a small history, two weak neighbours must not lift each other past a
/// clear match (tune half: R@10 0.587 with the rule, 0.589 without).
const NEIGHBOUR_MIN_COSINE: f64 = 0.3;
/// The most a lifted turn reaches, as a share of the score of the neighbour lifting it.
const NEIGHBOUR_CAP: f64 = 0.99;

/// Whether a scored candidate may lift its neighbours.
fn lifts(sc: &rank::Scored) -> bool {
    let part = |k: &str| sc.components.get(k).copied().unwrap_or(0.0);
    part("rrf_lexical") > 0.0 || part("semantic") >= NEIGHBOUR_MIN_COSINE
}

/// Speakers of the user's dialogue that the query names (whole word, any case).
async fn named_speakers(pool: &PgPool, user: &str, query: &str) -> Result<Vec<String>> {
    let speakers: Vec<String> = sqlx::query_scalar(include_str!("../../sql/memory/speakers.sql"))
        .bind(user)
        .fetch_all(pool)
        .await?;
    let words: HashSet<String> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    Ok(speakers
        .into_iter()
        .filter(|s| {
            let first = s.split_whitespace().next().unwrap_or("").to_lowercase();
            first.chars().count() >= 2 && words.contains(&first)
        })
        .collect())
}

async fn prefer_named_speakers(
    pool: &PgPool,
    user: &str,
    query: &str,
    scored: &mut [(MsgRow, rank::Scored)],
) -> Result<()> {
    let named = named_speakers(pool, user, query).await?;
    // Naming both speakers of a two-person dialogue prefers neither.
    if named.is_empty() || named.len() > 1 {
        return Ok(());
    }
    for (row, sc) in scored.iter_mut() {
        if named.contains(&row.speaker) {
            sc.score *= 1.0 + SPEAKER_BOOST;
            sc.components.insert("speaker".into(), SPEAKER_BOOST);
        }
    }
    Ok(())
}

/// Scores each message with a share of its best same-session neighbour's score, and
/// brings in neighbours of the best candidates that no retriever found.
async fn with_neighbours(
    pool: &PgPool,
    req: &SearchRequest,
    scored: &mut Vec<(MsgRow, rank::Scored)>,
) -> Result<()> {
    scored.sort_by(|a, b| b.1.score.total_cmp(&a.1.score).then(a.0.id.cmp(&b.0.id)));
    let sources: Vec<i64> = scored
        .iter()
        .take(NEIGHBOUR_SOURCES)
        .filter(|x| lifts(&x.1))
        .map(|x| x.0.id)
        .collect();
    if sources.is_empty() {
        return Ok(());
    }
    let pairs: Vec<(i64, Option<i64>, Option<i64>)> =
        sqlx::query_as(include_str!("../../sql/memory/message_neighbours.sql"))
            .bind(&req.scope.user_id)
            .bind(&sources)
            .bind(req.as_of)
            .fetch_all(pool)
            .await?;
    let base: HashMap<i64, f64> = scored.iter().map(|(r, s)| (r.id, s.score)).collect();
    // Best neighbour score each message can take, over both directions.
    let mut lift: HashMap<i64, f64> = HashMap::new();
    for (id, prev, next) in &pairs {
        let own = base.get(id).copied().unwrap_or(0.0);
        for n in [prev, next].into_iter().flatten() {
            let e = lift.entry(*n).or_default();
            *e = e.max(own);
        }
    }
    let missing: Vec<i64> = lift
        .keys()
        .filter(|id| !base.contains_key(id))
        .copied()
        .collect();
    if !missing.is_empty() {
        for row in fetch_messages(pool, &req.scope.user_id, &missing).await? {
            scored.push((
                row,
                rank::Scored {
                    score: 0.0,
                    components: BTreeMap::new(),
                    passes_gate: true,
                },
            ));
        }
    }
    for (row, sc) in scored.iter_mut() {
        if let Some(&l) = lift.get(&row.id) {
            let own = sc.score;
            let lifted = own + NEIGHBOUR_SHARE * l;
            // A turn lifted by a better neighbour stays just below it: the answer rises
            // with its question, never past it.
            let new = if own >= l {
                lifted
            } else {
                own.max(lifted.min(NEIGHBOUR_CAP * l))
            };
            sc.score = new;
            sc.components.insert("neighbour".into(), new - own);
        }
    }
    Ok(())
}

fn channel_score(want: Option<&str>, have: Option<&str>) -> f64 {
    match (want, have) {
        (_, None) => 0.25,
        (Some(w), Some(h)) if w == h => 1.0,
        _ => 0.0,
    }
}

struct MsgRow {
    id: i64,
    session_id: String,
    message_id: String,
    speaker: String,
    text: String,
    at: DateTime<Utc>,
    context: Option<String>,
    channel_id: Option<String>,
    unembedded: bool,
}

async fn fetch_messages(pool: &PgPool, user: &str, ids: &[i64]) -> Result<Vec<MsgRow>> {
    let rows = sqlx::query(include_str!("../../sql/memory/messages_by_id.sql"))
        .bind(user)
        .bind(ids)
        .fetch_all(pool)
        .await?;
    let mut out: Vec<MsgRow> = rows
        .iter()
        .map(|r| MsgRow {
            id: r.get("id"),
            session_id: r.get("session_id"),
            message_id: r.get("message_id"),
            speaker: r.get("speaker"),
            text: r.get("text"),
            at: r.get("at"),
            context: r.get("context"),
            channel_id: r.get("channel_id"),
            unembedded: r.get("unembedded"),
        })
        .collect();
    let pos = ranks(ids);
    out.sort_by_key(|r| pos.get(&r.id).copied().unwrap_or(usize::MAX));
    Ok(out)
}

async fn backfill(
    svc: &MemoryService,
    q: &[f32],
    rows: &mut [MsgRow],
    cos: &mut HashMap<i64, f64>,
) {
    let todo: Vec<&MsgRow> = rows
        .iter()
        .filter(|r| r.unembedded)
        .take(BACKFILL_PER_QUERY)
        .collect();
    if todo.is_empty() {
        return;
    }
    let texts = todo
        .iter()
        .map(|r| message_key(&r.speaker, &r.text, r.context.as_deref()))
        .collect();
    let Some(vecs) = svc.embed(texts).await else {
        return;
    };
    let ids: Vec<i64> = todo.iter().map(|r| r.id).collect();
    for (id, v) in ids.iter().zip(&vecs) {
        cos.insert(*id, embed::dot(q, v) as f64);
    }
    let vectors: Vec<Vector> = vecs.into_iter().map(Vector::from).collect();
    store_backfill(
        svc,
        include_str!("../../sql/memory/set_message_vectors.sql"),
        &ids,
        vectors,
    )
    .await;
    for r in rows.iter_mut() {
        if ids.contains(&r.id) {
            r.unembedded = false;
        }
    }
}

async fn memory_hits(
    svc: &MemoryService,
    req: &SearchRequest,
    now: DateTime<Utc>,
    qwords: &[String],
    qvec: Option<&[f32]>,
) -> Result<Vec<Hit>> {
    let mut facts = store::facts(&svc.pool, &req.scope, req.as_of, FACT_CANDIDATES).await?;
    if facts.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(q) = qvec {
        backfill_facts(svc, &mut facts).await;
        let _ = q;
    }
    let lex: Vec<f64> = facts
        .iter()
        .map(|f| {
            let t = format!(
                "{} {} {}",
                f.entity_label.as_deref().unwrap_or(""),
                f.text,
                f.evidence_text.as_deref().unwrap_or("")
            );
            overlap(qwords, &req.query, &t)
        })
        .collect();
    let sem: Vec<Option<f64>> = facts
        .iter()
        .map(|f| match (qvec, &f.embedding) {
            (Some(q), Some(b)) => Some(embed::dot_bytes(q, b) as f64),
            _ => None,
        })
        .collect();
    let mut lex_order: Vec<usize> = (0..facts.len()).filter(|&i| lex[i] > 0.0).collect();
    lex_order.sort_by(|&a, &b| lex[b].total_cmp(&lex[a]).then(a.cmp(&b)));
    let mut vec_order: Vec<usize> = (0..facts.len()).filter(|&i| sem[i].is_some()).collect();
    vec_order.sort_by(|&a, &b| {
        sem[b]
            .unwrap_or(0.0)
            .total_cmp(&sem[a].unwrap_or(0.0))
            .then(a.cmp(&b))
    });
    vec_order.truncate(VECTOR_CANDIDATES);
    let lr = ranks(&lex_order);
    let vr = ranks(&vec_order);
    let freq = rank::entity_frequency(
        &facts
            .iter()
            .map(|f| f.entity_refs.clone())
            .collect::<Vec<_>>(),
    );
    let mut hits = Vec::new();
    for (i, f) in facts.into_iter().enumerate() {
        if !lr.contains_key(&i) && !vr.contains_key(&i) {
            continue;
        }
        let s = Signals {
            lexical_rank: lr.get(&i).copied(),
            lexical: lex[i],
            semantic: if qvec.is_some() { sem[i] } else { None },
            vector_rank: vr.get(&i).copied(),
            confidence: f.confidence as f64,
            at: Some(f.valid_from),
            channel: channel_score(req.scope.channel_id.as_deref(), f.channel_id.as_deref()),
            entity_freq: freq[i],
            in_window: None,
            window_rank: None,
        };
        let scored = rank::score(req.ranker, &s, now);
        if req.strict && !scored.passes_gate {
            continue;
        }
        if req.ranker == RankerKind::Lexical && s.lexical_rank.is_none() {
            continue;
        }
        hits.push(Hit {
            kind: HitKind::Memory,
            id: format!("memory:{}", f.id),
            text: f.text,
            score: scored.score,
            components: scored.components,
            source_message_ids: f.source_message_ids,
            session_id: None,
            speaker: None,
            at: Some(f.valid_from),
            entity_refs: f.entity_refs,
        });
    }
    Ok(hits)
}

async fn backfill_facts(svc: &MemoryService, facts: &mut [store::Memory]) {
    let todo: Vec<usize> = (0..facts.len())
        .filter(|&i| facts[i].embedding.is_none())
        .take(BACKFILL_PER_QUERY)
        .collect();
    if todo.is_empty() {
        return;
    }
    let texts = todo
        .iter()
        .map(|&i| {
            store::embed_text(
                &facts[i].fact_type,
                &facts[i].text,
                facts[i].evidence_text.as_deref(),
            )
        })
        .collect();
    let Some(vecs) = svc.embed(texts).await else {
        return;
    };
    let bytes: Vec<Vec<u8>> = vecs.iter().map(|v| embed::to_bytes(v)).collect();
    let ids: Vec<i64> = todo.iter().map(|&i| facts[i].id).collect();
    for (&i, b) in todo.iter().zip(&bytes) {
        facts[i].embedding = Some(b.clone());
    }
    store_backfill(
        svc,
        include_str!("../../sql/memory/set_memory_vectors.sql"),
        &ids,
        bytes,
    )
    .await;
}

/// Writes vectors backfilled during a search. A failed write only costs the next search
/// the same backfill, so it is an event, not an error.
async fn store_backfill<V>(svc: &MemoryService, sql: &'static str, ids: &[i64], vectors: Vec<V>)
where
    Vec<V>: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
{
    let res = sqlx::query(sql)
        .bind(ids)
        .bind(vectors)
        .bind(svc.model_name())
        .execute(&svc.pool)
        .await;
    if let Err(e) = res {
        super::event(&svc.pool, "memory_backfill_error", &e.to_string(), None).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_and_names() {
        let q = "where does Ana live";
        let w = content_words(q);
        assert_eq!(
            w,
            vec!["does".to_string(), "ana".into(), "live".into()]
                .into_iter()
                .filter(|x| x != "does")
                .collect::<Vec<_>>()
        );
        assert_eq!(overlap(&w, q, "Ana lives in Porto"), 1.0);
        assert_eq!(overlap(&w, q, "Porto is nice"), 0.0);
        assert_eq!(
            names("I met Ana in Porto. She likes Tea"),
            vec!["ana", "porto", "tea"]
        );
    }
}
