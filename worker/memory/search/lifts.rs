//! The lifts over the fused scores: a named speaker's own words, and the turns around the
//! best hits (the answer often sits next to the turn that matched).

use std::collections::{BTreeMap, HashMap, HashSet};

use sqlx::PgPool;

use super::super::Result;
use super::rank;
use super::rows::{fetch_messages, MsgRow};
use super::SearchRequest;

/// How much a question that names a speaker prefers that speaker's own words: "what did
/// Ana say about Porto" is answered by what Ana said before what was said to her.
pub(super) const SPEAKER_BOOST: f64 = 0.4;
/// A message takes this share of its best neighbour's score: the turn that answers ("yes,
/// twice!") often shares no word with the question its neighbour asked.
pub(super) const NEIGHBOUR_SHARE: f64 = 0.5;
/// Candidates whose neighbours are looked up.
pub(super) const NEIGHBOUR_SOURCES: usize = 40;
/// A candidate lifts its neighbours only on evidence of its own (a BM25 match, or a cosine
/// this close): in a small history, two weak neighbours must not lift each other past a
/// clear match (tune half: R@10 0.587 with the rule, 0.589 without).
pub(super) const NEIGHBOUR_MIN_COSINE: f64 = 0.3;
/// The most a lifted turn reaches, as a share of the score of the neighbour lifting it.
pub(super) const NEIGHBOUR_CAP: f64 = 0.99;

/// Whether a scored candidate may lift its neighbours.
pub(super) fn lifts(sc: &rank::Scored) -> bool {
    let part = |k: &str| sc.components.get(k).copied().unwrap_or(0.0);
    part("rrf_lexical") > 0.0 || part("semantic") >= NEIGHBOUR_MIN_COSINE
}

/// Speakers of the user's dialogue that the query names (whole word, any case).
pub(super) async fn named_speakers(pool: &PgPool, user: &str, query: &str) -> Result<Vec<String>> {
    let speakers: Vec<String> =
        sqlx::query_scalar(include_str!("../../../sql/memory/speakers.sql"))
            .persistent(false)
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

pub(super) async fn prefer_named_speakers(
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
pub(super) async fn with_neighbours(
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
        sqlx::query_as(include_str!("../../../sql/memory/message_neighbours.sql"))
            .persistent(false)
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
